"""OOM304: drop `retain_graph=True` from a `backward` call."""

from __future__ import annotations

import libcst as cst

from oom_lsp.analysis.rule import NodeEdit, Replace


def drop_argument(call: cst.Call, argument: cst.Arg) -> tuple[NodeEdit, ...]:
    """The call without `argument`, keeping the other arguments' layout."""
    remaining = [arg for arg in call.args if arg is not argument]
    if remaining and call.args[-1] is argument:
        # The new last argument loses the comma that separated it from the dropped one.
        remaining[-1] = remaining[-1].with_changes(comma=cst.MaybeSentinel.DEFAULT)
    return (Replace(call, call.with_changes(args=remaining)),)
