"""What OOM402 reads around a candidate score matrix: whether a fused kernel
sits beside it, whether it is one entry of an attention dispatch, and whether
its query or key is something other than the sequence (a learned query, a
fixed position, windows, channels)."""

from __future__ import annotations

import re
from collections.abc import Sequence

import libcst as cst

from oom_lsp.analysis.cst_helpers import has_splat, int_value, method_call
from oom_lsp.analysis.rules._scan import (
    is_int_literal,
    names_read,
)

# Kernels that compute attention without storing the score matrix; code run
# under `sdpa_kernel(...)` calls scaled_dot_product_attention.
_FUSED_ATTENTION = frozenset(
    {
        "torch.nn.functional.scaled_dot_product_attention",
        "torch.nn.attention.sdpa_kernel",
        "torch.backends.cuda.sdp_kernel",
    }
)
# What keeps attention weights attention weights on their way to `@ v`.
WEIGHT_PRESERVING_METHODS = frozenset(
    {
        "to", "type", "type_as", "float", "half", "bfloat16", "double", "contiguous", "clone", "detach",
        "masked_fill", "masked_fill_", "nan_to_num", "view", "reshape", "transpose", "permute",
        "unsqueeze", "squeeze", "flatten", "mul", "mul_", "div", "div_",
    }
)  # fmt: skip
WEIGHT_PRESERVING_FUNCTIONS = frozenset(
    {"torch.nn.functional.dropout", "torch.dropout", "torch.where", "torch.nan_to_num", "torch.masked_fill"}
)
# Methods that broadcast or cast a tensor without changing what it holds.
BROADCAST_METHODS = frozenset(
    {"expand", "expand_as", "repeat", "unsqueeze", "to", "type_as", "float", "half", "contiguous", "reshape", "view"}
)  # fmt: skip


def names_read_by(small: cst.BaseSmallStatement) -> set[str]:
    """The names a small statement reads (an assignment's targets are not read,
    an augmented one's is)."""
    if isinstance(small, (cst.Assign, cst.AnnAssign)):
        return set(names_read(small.value)) if small.value is not None else set()
    return set(names_read(small))


def is_fused_kernel(qualified: str | None) -> bool:
    if qualified is None:
        return False
    if qualified in _FUSED_ATTENTION:
        return True
    root = qualified.split(".", 1)[0]
    last = qualified.rsplit(".", 1)[-1]
    if root == "flash_attn":
        return last.startswith("flash_attn")
    if root == "xformers":
        return last.startswith("memory_efficient_attention")
    return False


def statements_of(suite: cst.BaseSuite) -> Sequence[cst.BaseStatement]:
    return suite.body if isinstance(suite, cst.IndentedBlock) else ()


def ends_in_exit(suite: cst.BaseSuite) -> bool:
    """Whether the block's last statement is a `return` or a `raise`."""
    body = statements_of(suite)
    last = body[-1] if body else None
    return isinstance(last, cst.SimpleStatementLine) and isinstance(last.body[-1], (cst.Return, cst.Raise))


def method_named(owner: cst.ClassDef, name: str) -> cst.FunctionDef | None:
    return next(
        (
            statement
            for statement in statements_of(owner.body)
            if isinstance(statement, cst.FunctionDef) and statement.name.value == name
        ),
        None,
    )


class FileIndex:
    """The module-level functions and classes of a file, and the names a
    dispatch between implementations picks from (filled by the rule)."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.functions = {s.name.value: s for s in module.body if isinstance(s, cst.FunctionDef)}
        self.classes = [s for s in module.body if isinstance(s, cst.ClassDef)]
        # Worked out on demand by the rule (a walk of the whole file).
        self.dispatched: frozenset[str] | None = None


def _suites(statement: cst.CSTNode) -> list[cst.CSTNode]:
    """The blocks of a compound statement, an `elif` as the `If` it is."""
    suites: list[cst.CSTNode] = []
    body = getattr(statement, "body", None)
    if isinstance(body, cst.BaseSuite):
        suites.append(body)
    orelse = getattr(statement, "orelse", None)
    if isinstance(orelse, cst.If):
        suites.append(orelse)
    elif isinstance(orelse, cst.Else):
        suites.append(orelse.body)
    suites.extend(handler.body for handler in getattr(statement, "handlers", ()))
    finalbody = getattr(statement, "finalbody", None)
    if finalbody is not None:
        suites.append(finalbody.body)
    suites.extend(case.body for case in getattr(statement, "cases", ()))
    return suites


class Scope:
    """The statements of one function (or of the module) in source order, and
    the values bound to each local name: to follow a tensor back to what it
    was computed from, and the attention weights forward to their use."""

    def __init__(self, owner: cst.CSTNode) -> None:
        self.position: dict[int, int] = {}
        self.bindings: dict[str, list[tuple[int, cst.BaseExpression]]] = {}
        self.lines: list[tuple[int, cst.BaseSmallStatement]] = []
        body = owner.body  # type: ignore[attr-defined]
        if isinstance(body, cst.SimpleStatementSuite):
            self._small(body.body, 0)
        else:
            self._walk(body.body if isinstance(body, cst.IndentedBlock) else body)

    def _walk(self, statements: Sequence[cst.CSTNode]) -> None:
        for statement in statements:
            position = self.position[id(statement)] = len(self.position)
            if isinstance(statement, cst.SimpleStatementLine):
                self._small(statement.body, position)
                continue
            if isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue
            if isinstance(statement, cst.For):
                self._bind(statement.target, statement.iter, position)
            elif isinstance(statement, cst.With):
                for item in statement.items:
                    if item.asname is not None:
                        self._bind(item.asname.name, item.item, position)
            for suite in _suites(statement):
                if isinstance(suite, cst.SimpleStatementSuite):
                    self._small(suite.body, position)
                elif isinstance(suite, cst.IndentedBlock):
                    self._walk(suite.body)
                else:
                    self._walk([suite])

    def _small(self, body: Sequence[cst.BaseSmallStatement], position: int) -> None:
        for small in body:
            self.lines.append((position, small))
            if isinstance(small, cst.Assign):
                for target in small.targets:
                    self._bind(target.target, small.value, position)
            elif isinstance(small, (cst.AnnAssign, cst.AugAssign)) and small.value is not None:
                self._bind(small.target, small.value, position)

    def _bind(self, target: cst.BaseExpression, value: cst.BaseExpression, position: int) -> None:
        if isinstance(target, cst.Name):
            self.bindings.setdefault(target.value, []).append((position, value))
        elif isinstance(target, (cst.Tuple, cst.List)):
            elements = [element.value for element in target.elements]
            items = value.elements if isinstance(value, (cst.Tuple, cst.List)) else None
            if (
                items is not None
                and len(items) == len(elements)
                and all(isinstance(i, cst.Element) for i in items)
            ):
                for element, item in zip(elements, items):
                    self._bind(element, item.value, position)
            else:
                for element in elements:
                    self._bind(element, value, position)

    def lineage(self, expr: cst.BaseExpression, before: int) -> list[cst.BaseExpression]:
        """`expr` and every value bound, before position `before`, to a local
        name it is computed from, transitively (all branches: an over-approximation)."""
        found = [expr]
        pending = [expr]
        seen: set[str] = set()
        while pending:
            for name in names_read(pending.pop()):
                if name in seen:
                    continue
                seen.add(name)
                for position, value in self.bindings.get(name, ()):
                    if position < before:
                        found.append(value)
                        pending.append(value)
        return found


def selects_fixed_length(subscript: cst.Subscript) -> bool:
    """`x[:, 0]`, `x[:, :1]`, `x[:, 0:1, ...]`, `b[:, :, -1]`: a constant number of
    positions along an axis after the first (before any `...`, which counts
    from the end: `x[..., :64]` slices features)."""
    for position, element in enumerate(subscript.slice):
        selection = element.slice
        if isinstance(selection, cst.Index) and isinstance(selection.value, cst.Ellipsis):
            return False
        if position == 0:
            continue
        if isinstance(selection, cst.Index) and is_int_literal(selection.value):
            return True
        if isinstance(selection, cst.Slice) and selection.step is None and _constant_span(selection):
            return True
    return False


def _constant_span(selection: cst.Slice) -> bool:
    """`:1`, `0:1`, `-2:-1`: bounds whose distance does not depend on the length
    (`:-1` does)."""
    upper, lower = int_value_of(selection.upper), int_value_of(selection.lower)
    if upper is None:
        return False
    if selection.lower is None:
        return upper >= 0
    return lower is not None and (lower >= 0) == (upper >= 0)


def int_value_of(expr: cst.BaseExpression | None) -> int | None:
    """An integer literal's value, `-3` included."""
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        inner = int_value(expr.expression)
        return -inner if inner is not None else None
    return int_value(expr)


def pools_positions(dim: object) -> bool:
    """`.mean(1)`, `.mean(dim=-2)`, `.mean((2, 3))`: an average over positions
    (landmarks, a pooled query). Not over the batch (0) nor the features (-1)."""
    if not isinstance(dim, cst.Arg):
        return False
    if isinstance(dim.value, cst.Tuple):
        values = [int_value_of(element.value) for element in dim.value.elements]
        return bool(values) and None not in values and 0 not in values
    value = int_value_of(dim.value)
    return value is not None and value not in (0, -1)


def permutes_tokens_last(call: cst.Call, receiver: cst.BaseExpression) -> bool:
    """`proj(x).reshape(B, N, 3, H, -1).permute(2, 0, 3, 4, 1)`: the token axis of
    a (B, N, C) projection moved last, so `q @ k^T` contracts over tokens and
    the scores are channels x channels."""
    order = [int_value_of(arg.value) for arg in call.args]
    if len(order) < 4 or None in order or order[-1] != 1 or any(arg.keyword for arg in call.args):
        return False
    reshaped = method_call(receiver)
    if reshaped is None or reshaped[1] not in ("reshape", "view") or not isinstance(receiver, cst.Call):
        return False
    return len(receiver.args) >= 5 and not has_splat(receiver)


def _einops_axes(side: str) -> list[tuple[str, ...]] | None:
    axes: list[tuple[str, ...]] = []
    group: list[str] | None = None
    for token in re.findall(r"\.\.\.|[()]|\w+", side):
        if token == "(":
            if group is not None:
                return None
            group = []
        elif token == ")":
            if group is None:
                return None
            axes.append(tuple(group))
            group = None
        elif group is not None:
            group.append(token)
        else:
            axes.append((token,))
    return axes if group is None and axes else None


def _einops_sides(pattern: str) -> tuple[list[tuple[str, ...]], list[tuple[str, ...]]] | None:
    left, arrow, right = pattern.partition("->")
    inputs, outputs = _einops_axes(left), _einops_axes(right)
    if not arrow or inputs is None or outputs is None:
        return None
    return inputs, outputs


def folds_windows_into_batch(pattern: str) -> bool:
    """`b c (x w1) (y w2) -> (b x y) c w1 w2`: the positions of the windows of two
    split axes join the batch, so attention runs inside each window (heads
    alone folded into the batch, `(b h)`, are still global)."""
    sides = _einops_sides(pattern)
    if sides is None:
        return False
    inputs, outputs = sides
    batch = inputs[0]
    if len(batch) != 1 or batch[0] not in outputs[0]:
        return False
    folded = set(outputs[0]) - set(batch)
    split = [group for group in inputs if len(group) > 1]
    return sum(1 for group in split if folded & set(group)) >= 2


def moves_tokens_last(pattern: str) -> bool:
    """`b n (h d) -> b h d n`: the features split into heads and the token axis
    moved last, so `q @ k^T` contracts over tokens (channel attention)."""
    sides = _einops_sides(pattern)
    if sides is None:
        return False
    inputs, outputs = sides
    features, last = inputs[-1], outputs[-1]
    return (
        len(features) > 1
        and len(last) == 1
        and last[0] not in features
        and last[0] not in inputs[0]
        and (last[0],) in inputs
    )
