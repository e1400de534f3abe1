"""OOM301 / OOM302: stop keeping a graph by taking `.item()` or `.detach()`
of the value that is accumulated or stored."""

from __future__ import annotations

import libcst as cst

from oom_lsp.edits import InsertAfter, NodeEdit, Replace
from oom_lsp.fixes.codegen import code_at_indent

# Postfix-able expressions: `x.item()` needs no parentheses around them.
_ATOMS = (cst.Name, cst.Attribute, cst.Subscript, cst.Call)
# Moves between devices keep the graph; detaching first avoids copying it.
_TRANSFERS = frozenset({"cpu", "cuda", "to"})


def call_method(
    expr: cst.BaseExpression, method: str, indent: str, module: cst.Module
) -> tuple[NodeEdit, ...]:
    """`expr.method()`, parenthesising `expr` when it is not an atom
    (`indent`: the indentation of the statement around `expr`)."""
    if isinstance(expr, _ATOMS):
        return (InsertAfter(expr, f".{method}()"),)
    # The edit replaces the text inside `expr`'s own parentheses, if any.
    wrapped = expr.with_changes(lpar=[cst.LeftParen()], rpar=[cst.RightParen()])
    call = cst.Call(func=cst.Attribute(value=wrapped, attr=cst.Name(method)))
    return (Replace(expr, code_at_indent(call, indent, module)),)


def detach(expr: cst.BaseExpression, indent: str, module: cst.Module) -> tuple[NodeEdit, ...]:
    """`out.detach()`; `out.cpu()` becomes `out.detach().cpu()`."""
    if (
        isinstance(expr, cst.Call)
        and isinstance(expr.func, cst.Attribute)
        and expr.func.attr.value in _TRANSFERS
        and not expr.lpar
    ):
        return detach(expr.func.value, indent, module)
    return call_method(expr, "detach", indent, module)
