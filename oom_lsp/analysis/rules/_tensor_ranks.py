"""The number of dimensions of a tensor, where the code states it.

OOM402 needs it for one question: is `keys.transpose(2, 3)` the transpose
of the keys' last two dimensions? That holds exactly when `keys` has four
dimensions, and the code states the rank in a few ways that survive
ordinary code around them:

- the shape a `view`/`reshape`/`permute` gives it, or a shape unpacked
  from it (`b, h, t, d = x.shape`);
- operations that keep the rank: `transpose`, casts, `contiguous`,
  `repeat_interleave` (grouped-query attention repeating the key heads),
  `masked_fill`, slices that only cut along dimensions (`x[..., :half]`),
  `torch.cat` of tensors of that rank, a sign change;
- elementwise arithmetic with a tensor whose rank the code does not state:
  broadcasting adds leading dimensions only when that other tensor has
  more, and the tables multiplied into activations (positions, scales,
  masks) have fewer (`x * cos + rotated * sin`, rotary embeddings);
- the result of a function of the file (or a method of the class) whose
  straight-line body keeps its argument's rank (`apply_rope(keys, cos,
  sin)`), and of a submodule the class builds as a layer that keeps its
  input's shape (`torch.nn` norms, dropout, activations, or a class of
  the file whose `forward` keeps its input's rank: an `RMSNorm`).

Anything else is unknown (None): a rank is never guessed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import libcst as cst

from oom_lsp.analysis.cst_helpers import get_arg, has_splat, method_call
from oom_lsp.analysis.rules._attention_evidence import method_named, statements_of
from oom_lsp.analysis.rules._scan import descendants

# Methods whose result has the receiver's number of dimensions.
_SAME_RANK_METHODS = frozenset({
    "transpose", "swapaxes", "swapdims", "contiguous", "float", "half", "bfloat16", "double", "to", "type",
    "type_as", "clone", "detach", "repeat_interleave", "masked_fill", "masked_fill_", "softmax", "exp", "sqrt",
    "rsqrt", "neg", "abs", "pow", "mul", "add", "div", "sub",
})
_SAME_RANK_FUNCTIONS = frozenset({"torch.repeat_interleave", "torch.exp", "torch.tanh", "torch.sigmoid", "torch.neg"})
_CONCATENATE = frozenset({"torch.cat", "torch.concat", "torch.concatenate"})
_ELEMENTWISE = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide)
# `torch.nn` layers whose output has their input's shape.
_SHAPE_KEEPING_LAYERS = frozenset(
    f"torch.nn.{name}"
    for name in (
        "LayerNorm", "RMSNorm", "GroupNorm", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "InstanceNorm1d",
        "InstanceNorm2d", "InstanceNorm3d", "Dropout", "Dropout1d", "Dropout2d", "Dropout3d", "Identity", "ReLU",
        "GELU", "SiLU", "Tanh", "Sigmoid", "LeakyReLU", "Mish", "ELU", "Softmax",
    )
)

class Lookup(NamedTuple):
    """Where the code a call runs is found, asked afresh at each question (the
    rule's state is not kept here: no reference cycle outlives an analysis)."""

    callee: Callable[[cst.Call], cst.FunctionDef | None]  # a function of the file, a method of the class
    owner: cst.ClassDef | None  # the class being visited
    classes: Callable[[], dict[str, cst.ClassDef]]  # the file's classes by name (built when first asked)


class TensorRanks:
    """Per function, the local names whose rank the code states; filled as the
    rule's visitor meets assignments, read at any expression."""

    def __init__(self, call_name: Callable[[cst.Call], str | None]) -> None:
        self._call_name = call_name
        # `self.<attr>` of a class -> the forward its layers share (or None).
        self._submodules: dict[tuple[int, str], cst.FunctionDef | None] = {}
        self._frames: list[dict[str, int]] = [{}]
        # Functions whose result is being worked out (no recursion).
        self._evaluating: set[int] = set()

    def enter(self) -> None:
        self._frames.append({})

    def leave(self) -> None:
        self._frames.pop()

    def rebind(self, targets: list[cst.BaseExpression], value: cst.BaseExpression, lookup: Lookup) -> None:
        _bind(self._frames[-1], targets, value, lambda expr, env: self._rank(expr, env, lookup))

    def rank(self, expr: cst.BaseExpression, lookup: Lookup) -> int | None:
        return self._rank(expr, self._frames[-1], lookup)

    # --- the facts ------------------------------------------------------------
    def _rank(self, expr: cst.BaseExpression, env: dict[str, int], lookup: Lookup) -> int | None:
        def rank(sub: cst.BaseExpression) -> int | None:
            return self._rank(sub, env, lookup)

        if isinstance(expr, cst.Name):
            return env.get(expr.value)
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
            return rank(expr.expression)
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, _ELEMENTWISE):
            known = [r for r in (rank(expr.left), rank(expr.right)) if r is not None]
            return max(known) if known else None
        if isinstance(expr, cst.Subscript):
            # Slices and `...` cut along dimensions; an index or None changes the rank.
            if all(isinstance(element.slice, cst.Index) and isinstance(element.slice.value, cst.Ellipsis)
                   or isinstance(element.slice, cst.Slice) for element in expr.slice):
                return rank(expr.value)
            return None
        if not isinstance(expr, cst.Call) or has_splat(expr):
            return None
        name = self._call_name(expr)
        if name in _CONCATENATE:
            tensors = get_arg(expr, "tensors", 0)
            if tensors is not None and isinstance(tensors.value, (cst.Tuple, cst.List)):
                known = {rank(element.value) for element in tensors.value.elements} - {None}
                return known.pop() if len(known) == 1 else None
            return None
        if name in _SAME_RANK_FUNCTIONS and expr.args:
            return rank(expr.args[0].value)
        called = method_call(expr)
        if called is not None and name is None:
            receiver, method = called
            if method in ("view", "reshape", "permute"):
                return _stated_rank(expr)
            if method in _SAME_RANK_METHODS:
                return rank(receiver)
            if method in ("unsqueeze", "squeeze") and len(expr.args) == 1:
                base = rank(receiver)
                return None if base is None else base + (1 if method == "unsqueeze" else -1)
        if name is None:
            return self._result_rank(expr, env, lookup)
        return None

    def _result_rank(self, call: cst.Call, env: dict[str, int], lookup: Lookup) -> int | None:
        """The rank a call of the file's own code returns, given its arguments."""
        arg_ranks = [self._rank(arg.value, env, lookup) for arg in call.args]
        if all(found is None for found in arg_ranks):
            return None  # nothing to follow (most calls): no need to find the code
        function = lookup.callee(call)
        skip_self = isinstance(call.func, cst.Attribute)
        if function is None:
            function = self._shape_keeping_submodule(call, lookup)
            if function is None:
                return None
            skip_self = True
        if id(function) in self._evaluating:
            return None
        params = [param.name.value for param in function.params.params]
        if skip_self and params and params[0] == "self":
            params = params[1:]
        bound: dict[str, int] = {}
        positional = 0
        for arg, arg_rank in zip(call.args, arg_ranks):
            name = arg.keyword.value if arg.keyword is not None else (
                params[positional] if positional < len(params) else None)
            if arg.keyword is None:
                positional += 1
            if name is not None and arg_rank is not None:
                bound[name] = arg_rank
        self._evaluating.add(id(function))
        try:
            return self._straight_line_result(function, bound, lookup)
        finally:
            self._evaluating.discard(id(function))

    def _straight_line_result(self, function: cst.FunctionDef, env: dict[str, int], lookup: Lookup) -> int | None:
        """The rank of what a body of assignments and `if` blocks returns (the
        ranks after an `if` are those both ways agree on); a loop, or a
        `return` inside a branch, could change it: unknown."""
        try:
            returned = self._run(statements_of(function.body), env, lookup)
        except _Unknown:
            return None
        return returned[0] if returned is not None else None

    def _run(self, statements: list[cst.CSTNode], env: dict[str, int], lookup: Lookup) -> tuple[int | None] | None:
        """Runs a block over `env`: (rank,) when it returns, None when it falls
        through; raises _Unknown where it cannot follow."""
        def rank(expr: cst.BaseExpression, e: dict[str, int]) -> int | None:
            return self._rank(expr, e, lookup)

        for statement in statements:
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if isinstance(small, cst.Return):
                        return (None if small.value is None else rank(small.value, env),)
                    if isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is not None:
                        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
                        _bind(env, targets, small.value, rank)
                    # `x *= scale` (elementwise: the rank stays), asserts, calls.
            elif isinstance(statement, cst.If) and not isinstance(statement.orelse, cst.If):
                taken = dict(env)
                if self._run(statements_of(statement.body), taken, lookup) is not None:
                    raise _Unknown
                other = dict(env)
                if statement.orelse is not None and self._run(
                    statements_of(statement.orelse.body), other, lookup
                ) is not None:
                    raise _Unknown
                env.clear()
                env.update({name: r for name, r in taken.items() if other.get(name) == r})
            elif isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                continue
            else:
                raise _Unknown
        return None

    def _shape_keeping_submodule(self, call: cst.Call, lookup: Lookup) -> cst.FunctionDef | None:
        func, owner = call.func, lookup.owner
        if owner is None or not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name)
                                 and func.value.value == "self") or len(call.args) != 1:
            return None
        key = (id(owner), func.attr.value)
        if key not in self._submodules:
            self._submodules[key] = self._layers_forward(owner, func.attr.value, lookup)
        return self._submodules[key]

    def _layers_forward(self, owner: cst.ClassDef, attr: str, lookup: Lookup) -> cst.FunctionDef | None:
        """For `self.norm(x)`: a stand-in whose result is its argument when
        every layer the class ever assigns to `self.norm` keeps its input's
        shape (None aside: `self.norm = RMSNorm(d) if qk_norm else None`),
        or that layer's `forward` when it is a class of the file."""
        forwards: set[int] = set()
        found: cst.FunctionDef | None = None
        layers = 0
        for node in descendants(owner):
            if not isinstance(node, cst.Assign):
                continue
            if not any(isinstance(t.target, cst.Attribute) and isinstance(t.target.value, cst.Name)
                       and t.target.value.value == "self" and t.target.attr.value == attr
                       for t in node.targets):
                continue
            for built in _built_values(node.value):
                if built is None:
                    continue
                layers += 1
                name = self._call_name(built)
                if name in _SHAPE_KEEPING_LAYERS:
                    forwards.add(0)
                    found = found or _IDENTITY
                    continue
                cls = lookup.classes().get(built.func.value) if isinstance(built.func, cst.Name) else None
                forward = method_named(cls, "forward") if cls is not None else None
                if forward is None:
                    return None
                forwards.add(id(forward))
                found = forward
        if layers == 0 or len(forwards) != 1:
            return None
        return found


class _Unknown(Exception):
    """A body the rank cannot be followed through."""


def _identity_forward() -> cst.FunctionDef:
    return cst.parse_module("def forward(self, x):\n    return x\n").body[0]  # type: ignore[return-value]


_IDENTITY = _identity_forward()


def _built_values(value: cst.BaseExpression) -> list[cst.Call | None]:
    """The layers `value` builds: a call, None, or either side of a conditional;
    [a non-call] when it is anything else."""
    if isinstance(value, cst.IfExp):
        return _built_values(value.body) + _built_values(value.orelse)
    if isinstance(value, cst.Name) and value.value == "None":
        return [None]
    if isinstance(value, cst.Call) and not has_splat(value):
        return [value]
    return [cst.Call(func=cst.Name("__unknown__"))]


def _bind(env: dict[str, int], targets: list[cst.BaseExpression], value: cst.BaseExpression,
          rank: Callable[[cst.BaseExpression, dict[str, int]], int | None]) -> None:
    for target in targets:
        if isinstance(target, cst.Name):
            found = rank(value, env)
            env.pop(target.value, None)
            if found is not None:
                env[target.value] = found
            continue
        elements = target.elements if isinstance(target, (cst.Tuple, cst.List)) else None
        if elements is not None and not any(isinstance(e, cst.StarredElement) for e in elements):
            shape_of = _unpacked_shape(value)
            if shape_of is not None:
                # `b, h, t, d = x.shape`: x has as many dimensions as names.
                for element in elements:
                    if isinstance(element.value, cst.Name):
                        env.pop(element.value.value, None)
                env[shape_of] = len(elements)
                continue
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(elements) and not any(
                isinstance(e, cst.StarredElement) for e in value.elements
            ):
                # `keys, values = keys_new, values_new`: pairwise.
                found = [rank(e.value, env) for e in value.elements]
                for element, element_rank in zip(elements, found):
                    _bind_one(env, element.value, element_rank)
                continue
        for node in descendants(target):
            if isinstance(node, cst.Name):
                env.pop(node.value, None)


def _bind_one(env: dict[str, int], target: cst.BaseExpression, found: int | None) -> None:
    if isinstance(target, cst.Name):
        env.pop(target.value, None)
        if found is not None:
            env[target.value] = found
        return
    for node in descendants(target):
        if isinstance(node, cst.Name):
            env.pop(node.value, None)


def _unpacked_shape(value: cst.BaseExpression) -> str | None:
    """`x` for `x.shape` and `x.size()`."""
    if isinstance(value, cst.Attribute) and value.attr.value == "shape" and isinstance(value.value, cst.Name):
        return value.value.value
    called = method_call(value)
    if called is not None and called[1] == "size" and not value.args and isinstance(called[0], cst.Name):  # type: ignore[union-attr]
        return called[0].value
    return None


def _stated_rank(call: cst.Call) -> int | None:
    """The number of dimensions `view`/`reshape`/`permute` states."""
    args = [arg.value for arg in call.args if arg.keyword is None]
    if len(args) == 1 and isinstance(args[0], (cst.Tuple, cst.List)):
        if any(isinstance(element, cst.StarredElement) for element in args[0].elements):
            return None
        return len(args[0].elements)
    if len(args) == 1:
        return None  # a dtype or a shape variable
    return len(args) if len(args) == len(call.args) else None
