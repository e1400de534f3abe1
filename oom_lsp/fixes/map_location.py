"""OOM501: pass `map_location="cpu"` to `torch.load` (and `weights_only=True`
where the rule has shown that only a state dict is loaded), or make a GPU
`map_location` the CPU."""

from __future__ import annotations

import libcst as cst

from oom_lsp.edits import InsertAfter, NodeEdit, Replace


def add_map_location(call: cst.Call, *, weights_only: bool = False) -> tuple[NodeEdit, ...]:
    """Add the keywords after the last argument, keeping the call's layout."""
    keywords = 'map_location="cpu", weights_only=True' if weights_only else 'map_location="cpu"'
    if not call.args:
        return (Replace(call, call.with_changes(args=cst.parse_expression(f"f({keywords})").args)),)
    return (InsertAfter(call.args[-1].value, f", {keywords}"),)


def map_location_to_cpu(location: cst.Arg) -> tuple[NodeEdit, ...]:
    """`map_location=self.device` -> `map_location="cpu"` (positional or keyword)."""
    return (Replace(location.value, cst.SimpleString('"cpu"')),)
