"""OOM304: drop `retain_graph=True` from a `backward` call."""

from __future__ import annotations

import libcst as cst

from oom_lsp.edits import NodeEdit, Replace
from oom_lsp.fixes.codegen import code_at_indent


def drop_argument(call: cst.Call, argument: cst.Arg, indent: str, module: cst.Module) -> tuple[NodeEdit, ...]:
    """The call without `argument`, keeping the other arguments' layout
    (`indent`: the indentation of the statement around the call)."""
    remaining = [arg for arg in call.args if arg is not argument]
    if remaining and call.args[-1] is argument:
        # The new last argument takes the dropped one's trailing comma (or
        # its absence), so a one-argument-per-line layout stays as it was.
        remaining[-1] = remaining[-1].with_changes(comma=argument.comma)
    if not remaining:
        new_call = call.with_changes(args=(), whitespace_before_args=cst.SimpleWhitespace(""))
    else:
        new_call = call.with_changes(args=remaining)
    return (Replace(call, code_at_indent(new_call, indent, module)),)
