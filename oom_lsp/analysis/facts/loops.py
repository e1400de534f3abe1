"""How many times a loop runs, when the code states it.

A loop over a collection the code lists (`for net, opt in zip(nets, opts)`
with `nets = [net_a, net_b]`, `for head in (cls_head, box_head)`) runs
once per item, a fixed, small number of times: what it keeps from one
iteration to the next grows to that many entries and no further, unlike a
loop over a data loader or over training steps. `range(n)` counts
repetitions (steps, epochs), not items, and bounds nothing here. The leak
rules use the bound to tell a per-step growth from a loop over a few models
or heads.
"""

from __future__ import annotations

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.facts.program import BindingKind, Function, program_of

# At most this many iterations: a loop over a few models, heads or losses,
# not over steps.
FEW_ITERATIONS = 16

_SAME_LENGTH = frozenset({"enumerate", "reversed", "list", "tuple", "sorted"})
_GROWING_METHODS = frozenset({"append", "extend", "insert", "add", "update", "__setitem__"})


def runs_a_few_times(context: FileContext, loop: cst.CSTNode, function: cst.FunctionDef | None) -> bool:
    """The loop runs once per item of a short collection the code lists (a few
    models, heads or losses), not once per step."""
    bound = iteration_bound(context, loop, function)
    return bound is not None and bound <= FEW_ITERATIONS


def iteration_bound(context: FileContext, loop: cst.CSTNode, function: cst.FunctionDef | None) -> int | None:
    """The number of iterations of a `for` loop, when the code states the
    length of the listed collection it iterates; None otherwise (a loader,
    a dataset, `range(n)`, a `while`, a collection that grows)."""
    if type(loop) is not cst.For:
        return None
    program = program_of(context)
    scope = program.function(function) if function is not None else program.module
    if scope is None:
        return None
    return _length(context, loop.iter, scope, function, 0)


def _length(
    context: FileContext, expr: cst.BaseExpression, scope: Function, function: cst.FunctionDef | None, depth: int
) -> int | None:
    expr_type = type(expr)
    if expr_type in (cst.List, cst.Tuple, cst.Set):
        if any(type(element) is cst.StarredElement for element in expr.elements):  # type: ignore[attr-defined]
            return None
        return len(expr.elements)  # type: ignore[attr-defined]
    if expr_type is cst.Call:
        name = dotted_name(expr.func)  # type: ignore[attr-defined]
        args = [arg for arg in expr.args if arg.keyword is None and not arg.star]  # type: ignore[attr-defined]
        if name == "zip" and args:
            lengths = [_length(context, arg.value, scope, function, depth) for arg in args]
            known = [length for length in lengths if length is not None]
            return min(known) if known else None
        if name in _SAME_LENGTH and len(args) >= 1:
            return _length(context, args[0].value, scope, function, depth)
        return None
    if expr_type is cst.Name and depth < 3:
        name = expr.value  # type: ignore[attr-defined]
        bindings = program_of(context).lookup(name, scope)
        if not bindings or any(b.kind is not BindingKind.ASSIGN or b.value is None for b in bindings):
            return None
        if _grows_anywhere(context, name):
            return None
        lengths = [_length(context, b.value, scope, function, depth + 1) for b in bindings]  # type: ignore[arg-type]
        if any(length is None for length in lengths):
            return None
        return max(lengths)  # type: ignore[type-var]
    return None


def _grows_anywhere(context: FileContext, name: str) -> bool:
    """`name.append(...)` (or extend, insert, ...) in some scope of the file."""
    for scope in program_of(context).functions:
        for call in scope.calls:
            func = call.node.func
            if (
                type(func) is cst.Attribute
                and func.attr.value in _GROWING_METHODS
                and type(func.value) is cst.Name
                and func.value.value == name
            ):
                return True
    return False


def unrolls_a_recurrence(loop: cst.CSTNode) -> bool:
    """The loop is one forward pass unrolled over positions: it counts
    (`for t in range(target_length)`) and each iteration feeds a call the
    state that call returned in the previous one (`out, hidden =
    decoder(inp, hidden)`), with no backward pass inside. What it sums
    over its iterations (a sequence's loss over decoder steps) is one
    sequence's graph, the graph of a single forward pass, not one per step
    of training."""
    if type(loop) is not cst.For or type(loop.body) is not cst.IndentedBlock:
        return False
    if type(loop.iter) is not cst.Call or dotted_name(loop.iter.func) != "range":
        return False
    recurrent = False
    for node in _statements(loop.body.body):
        if type(node) is cst.Expr and _calls_backward(node.value):
            return False
        if type(node) is cst.Assign and len(node.targets) == 1 and type(node.value) is cst.Call:
            bound = _names(node.targets[0].target)
            fed = {name for arg in node.value.args for name in _names(arg.value)}
            recurrent = recurrent or bool(bound & fed)
    return recurrent


def _statements(body: list[cst.BaseStatement] | tuple[cst.BaseStatement, ...]) -> list[cst.BaseSmallStatement]:
    """The small statements of a block and of the blocks nested in it (not of nested functions)."""
    found: list[cst.BaseSmallStatement] = []
    for statement in body:
        if type(statement) is cst.SimpleStatementLine:
            found.extend(statement.body)
        elif not isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
            for block in (getattr(statement, "body", None), getattr(getattr(statement, "orelse", None), "body", None)):
                if type(block) is cst.IndentedBlock:
                    found.extend(_statements(block.body))
    return found


def _names(expr: cst.BaseExpression) -> set[str]:
    """The plain names of a target or argument: `h`, `(out, h)`, `[h, c]`."""
    if type(expr) is cst.Name:
        return {expr.value}
    if type(expr) in (cst.Tuple, cst.List):
        return {name for element in expr.elements for name in _names(element.value)}  # type: ignore[attr-defined]
    return set()


def _calls_backward(expr: cst.BaseExpression) -> bool:
    return type(expr) is cst.Call and type(expr.func) is cst.Attribute and expr.func.attr.value == "backward"
