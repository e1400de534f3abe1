"""Local scans the OOM4xx-6xx rules run once they have a candidate.

The batched pass tells a rule where it is; deciding whether a fix is safe
needs a look around the candidate (every use of a name in a loop, the
statement after it). These scans walk only the subtree they are given.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from operator import attrgetter
from typing import Callable, Iterator, Sequence

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.walker import is_node

# Nodes whose contents do not run where they are written.
SCOPES = (cst.FunctionDef, cst.ClassDef, cst.Lambda)


_LAYOUT_FIELDS = frozenset(
    {
        "lpar", "rpar", "lbracket", "rbracket", "lbrace", "rbrace", "comma", "semicolon",
        "leading_lines", "header", "footer", "trailing_whitespace", "newline",
    }
)  # fmt: skip


@lru_cache(maxsize=None)
def _node_fields(node_class: type) -> tuple[str, ...]:
    """The fields of a node class that can hold nodes other than whitespace
    and punctuation (libcst's `children` builds them all, and costs ~10x)."""
    return tuple(
        field.name
        for field in dataclasses.fields(node_class)
        if not field.name.startswith("whitespace") and field.name not in _LAYOUT_FIELDS
    )


@lru_cache(maxsize=None)
def _field_reader(node_class: type) -> Callable[[cst.CSTNode], tuple[object, ...]] | None:
    names = _node_fields(node_class)
    if not names:
        return None
    read = attrgetter(*names)
    return (lambda node: (read(node),)) if len(names) == 1 else read  # type: ignore[return-value]


def children(node: cst.CSTNode) -> list[cst.CSTNode]:
    """The nodes directly under `node`, whitespace and punctuation left out."""
    # Exact type tests through `is_node`: isinstance() on libcst's classes
    # goes through ABCMeta, and whole-file scans call this for every node.
    read = _field_reader(type(node))
    if read is None:
        return []
    children: list[cst.CSTNode] = []
    for value in read(node):
        if type(value) is list or type(value) is tuple:
            children.extend(item for item in value if is_node(item))
        elif is_node(value):
            children.append(value)
    return children


def descendants(node: cst.CSTNode, *, skip: tuple[type[cst.CSTNode], ...] = ()) -> Iterator[cst.CSTNode]:
    """Every node under `node` (itself included), parents before children;
    nodes of the `skip` types below `node` are yielded but not entered."""
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if skip and current is not node and type(current) in skip:
            continue
        stack.extend(children(current))


def references(node: cst.CSTNode, dotted: str) -> list[cst.BaseExpression]:
    """The expressions under `node` that spell the name `dotted` (`x`, `self.buf`).

    `obj.x` is not a reference to `x`, and neither is the keyword of `f(x=1)`.
    """
    found: list[cst.BaseExpression] = []
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        current_type = type(current)
        if (current_type is cst.Name or current_type is cst.Attribute) and dotted_name(current) == dotted:
            found.append(current)
            continue
        if current_type is cst.Attribute or current_type is cst.Arg:
            stack.append(current.value)
        else:
            stack.extend(children(current))
    return found


def enclosing_block(
    statements: Sequence[cst.CSTNode], module: cst.Module, statement: cst.CSTNode
) -> Sequence[cst.BaseStatement] | None:
    """The statement list that holds `statement`, found through the tracker's
    stack of enclosing statements; None for a one-line suite (`for x in y: z`)."""
    index = next((i for i in range(len(statements) - 1, -1, -1) if statements[i] is statement), None)
    if index is None:
        return None
    parent = statements[index - 1] if index > 0 else module
    for block in _blocks(parent):
        if any(child is statement for child in block):
            return block
    return None


def _blocks(parent: cst.CSTNode) -> Iterator[Sequence[cst.BaseStatement]]:
    if isinstance(parent, cst.Module):
        yield parent.body
        return
    suites: list[object] = [getattr(parent, "body", None)]
    orelse = getattr(parent, "orelse", None)
    if isinstance(orelse, cst.Else):
        suites.append(orelse.body)
    suites.extend(handler.body for handler in getattr(parent, "handlers", ()))
    finalbody = getattr(parent, "finalbody", None)
    if finalbody is not None:
        suites.append(finalbody.body)
    suites.extend(case.body for case in getattr(parent, "cases", ()))
    for suite in suites:
        if isinstance(suite, cst.IndentedBlock):
            yield suite.body


def scope_of(function: cst.FunctionDef | None, module: cst.Module) -> cst.CSTNode:
    """The node whose names a local variable of `function` can collide with."""
    return function if function is not None else module


def free_name(scope: cst.CSTNode, wanted: str) -> str:
    """`wanted`, or `wanted_2`, `wanted_3`... whichever `scope` does not use yet."""
    used = {node.value for node in descendants(scope) if isinstance(node, cst.Name)}
    candidate, suffix = wanted, 2
    while candidate in used:
        candidate, suffix = f"{wanted}_{suffix}", suffix + 1
    return candidate


def is_int_literal(expr: cst.BaseExpression) -> bool:
    """`3`, `-1`: a value that is the same wherever it is evaluated."""
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        expr = expr.expression
    return isinstance(expr, cst.Integer)


def is_optimizer_like(receiver: cst.BaseExpression) -> bool:
    """Whether `receiver.step()` is an optimizer step: `optimizer`,
    `self.optim`, `opt`, or a grad scaler (`scaler.step(optimizer)`)."""
    name = dotted_name(receiver)
    if name is None:
        return False
    last = name.rsplit(".", 1)[-1].lower()
    return "optim" in last or last in ("opt", "scaler")


def single_assignment(statement: cst.CSTNode | None) -> cst.Assign | None:
    """The `Assign` of a line that holds exactly one assignment to one target."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    assign = statement.body[0]
    if isinstance(assign, cst.Assign) and len(assign.targets) == 1:
        return assign
    return None


def names_read(node: cst.CSTNode) -> Iterator[str]:
    """The plain names an expression reads (`x` in `x.view(b, n)` and `f(y=x)`,
    but not `view` nor the keyword `y`)."""
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        current_type = type(current)
        if current_type is cst.Name:
            yield current.value
        elif current_type is cst.Attribute or current_type is cst.Arg:
            stack.append(current.value)
        else:
            stack.extend(children(current))
