"""OOM503: `zero_grad(set_to_none=True)`."""

from __future__ import annotations

import libcst as cst

from oom_lsp.edits import NodeEdit, Replace


def set_to_none(argument: cst.Arg) -> tuple[NodeEdit, ...]:
    """Turn the `False` of `set_to_none=False` (or `zero_grad(False)`) into
    `True`, keeping the keyword or positional form."""
    return (Replace(argument.value, "True"),)
