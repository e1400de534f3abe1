"""Paths through a function that one flag chooses between.

One function often runs both the training and the evaluation of an epoch,
chosen by a flag: `model.train() if is_train else model.eval()`, the forward
pass, then `if is_train: loss.backward()`. Merging both arms (train or eval;
a backward or none) loses what decides a finding: on the `is_train=False`
path the model is in eval mode, runs with autograd on, and no backward pass
uses what it records. This module enumerates the values of such a flag and
says, for each, which of the statements it guards run.

A guard is an `if` on one name: `if is_train:`, `if not training:`,
`if phase == "train":`, `if mode != "val":`, `if split in ("train",):`,
`if is_train is True:`, with its `else`/`elif` arms. `torch.set_grad_enabled(flag)`
and `model.train(flag)` follow the flag too. Code guarded by anything else is
not enumerated (the caller falls back to merging the arms).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.cst_helpers import string_value

# A value a flag can take: True, False, a string literal, or OTHER (none of those compared).
OTHER = object()
Value = object


@dataclass(frozen=True)
class Guard:
    flag: str
    # Whether the guarded code runs for a value of the flag.
    holds: Callable[[Value], bool]
    literals: tuple[Value, ...]


def condition(test: cst.BaseExpression) -> Guard | None:
    """The guard an `if` test sets on one flag, or None when it is not one."""
    if type(test) is cst.UnaryOperation and type(test.operator) is cst.Not:
        inner = condition(test.expression)
        if inner is None:
            return None
        return Guard(inner.flag, lambda value, held=inner.holds: not held(value), inner.literals)
    name = dotted_name(test)
    if name is not None:
        return Guard(name, _truthy, (True, False))
    if type(test) is not cst.Comparison or len(test.comparisons) != 1:
        return None
    flag = dotted_name(test.left)
    if flag is None:
        return None
    target = test.comparisons[0]
    operator = type(target.operator)
    right = target.comparator
    if operator in (cst.Is, cst.IsNot) and type(right) is cst.Name and right.value in ("True", "False"):
        wanted = right.value == "True"
        same = operator is cst.Is
        return Guard(flag, lambda value, w=wanted, s=same: (value is w) == s, (True, False))
    if operator in (cst.Equal, cst.NotEqual):
        literal = string_value(right)
        if literal is None:
            return None
        equal = operator is cst.Equal
        return Guard(flag, lambda value, lit=literal, e=equal: (value == lit) == e, (literal,))
    if operator in (cst.In, cst.NotIn) and type(right) in (cst.Tuple, cst.List, cst.Set):
        literals = tuple(string_value(element.value) for element in right.elements)
        if any(literal is None for literal in literals):
            return None
        inside = operator is cst.In
        return Guard(flag, lambda value, lits=literals, i=inside: (value in lits) == i, literals)
    return None


def _truthy(value: Value) -> bool:
    if value is OTHER:
        return True
    return bool(value)


def guards_of(path: Sequence[cst.CSTNode], stop: cst.CSTNode | None = None) -> list[Guard] | None:
    """The guards of the `if` arms that hold the last statement of `path`
    (after `stop`, the scope's own statement, when given). None when an `if`
    around it tests something that is not a flag."""
    guards: list[Guard] = []
    started = stop is None
    for outer, inner in zip(path, path[1:]):
        if not started:
            started = outer is stop
            if not started:
                continue
        if type(outer) is not cst.If:
            continue
        guard = condition(outer.test)
        in_body = type(outer.body) is cst.IndentedBlock and any(statement is inner for statement in outer.body.body)
        if guard is None:
            return None
        if in_body:
            guards.append(guard)
        else:
            # The `else` arm, or an `elif` (the nested `If` is `outer.orelse`).
            guards.append(Guard(guard.flag, lambda value, held=guard.holds: not held(value), guard.literals))
    return guards


def values_of(flag: str, guards: Iterable[Guard]) -> list[Value]:
    """The values worth trying for a flag: those its guards compare with, and one more."""
    values: list[Value] = []
    for guard in guards:
        if guard.flag != flag:
            continue
        for literal in guard.literals:
            if literal not in values:
                values.append(literal)
    if not any(type(value) is bool for value in values):
        values.append(OTHER)
    return values


def runs(guards: Sequence[Guard], flag: str, value: Value) -> bool | None:
    """Whether code under `guards` runs when `flag` has `value`; None when a
    guard tests another flag."""
    for guard in guards:
        if guard.flag != flag:
            return None
        if not guard.holds(value):
            return False
    return True


def truthy(value: Value) -> bool:
    return _truthy(value)
