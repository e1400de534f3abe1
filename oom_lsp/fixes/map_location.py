"""OOM501: pass `map_location="cpu"` to `torch.load`."""

from __future__ import annotations

import libcst as cst

from oom_lsp.edits import InsertAfter, NodeEdit, Replace


def add_map_location(call: cst.Call) -> tuple[NodeEdit, ...]:
    """Add the keyword after the last argument, keeping the call's layout."""
    keyword = 'map_location="cpu"'
    if not call.args:
        return (Replace(call, call.with_changes(args=[cst.parse_expression(f"f({keyword})").args[0]])),)
    return (InsertAfter(call.args[-1].value, f", {keyword}"),)
