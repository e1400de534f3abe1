"""OOM202: float64 -> float32, spelled the way the file already spells torch."""

from __future__ import annotations

import libcst as cst

from oom_lsp.edits import NodeEdit, Replace

# The double-precision spelling -> its single-precision twin.
_SINGLE_PRECISION = {
    "float64": "float32",
    "double": "float32",
    "DoubleTensor": "FloatTensor",
}


def to_float32(expr: cst.BaseExpression) -> tuple[NodeEdit, ...] | None:
    """`T.float64` / `T.double` -> `T.float32`, `torch.cuda.DoubleTensor` ->
    `torch.cuda.FloatTensor` (also spelled as a string): only the attribute
    changes, so the alias stays.

    None for a bare imported name (`from torch import float64`): the file
    may have no spelling of `float32` at hand.
    """
    if isinstance(expr, cst.Attribute) and expr.attr.value in _SINGLE_PRECISION:
        return (Replace(expr.attr, _SINGLE_PRECISION[expr.attr.value]),)
    if isinstance(expr, cst.SimpleString) and "DoubleTensor" in expr.value:
        # `set_default_tensor_type("torch.cuda.DoubleTensor")`
        return (Replace(expr, expr.value.replace("DoubleTensor", "FloatTensor")),)
    return None


def double_call_to_float(call: cst.Call) -> tuple[NodeEdit, ...] | None:
    """`x.double()` -> `x.float()`."""
    if isinstance(call.func, cst.Attribute) and call.func.attr.value == "double" and not call.args:
        return (Replace(call.func.attr, "float"),)
    return None
