"""The shape of a tensor, where the code states it: its number of dimensions,
and a name for each dimension it can name.

OOM402 asks two questions of it. Is `keys.transpose(2, 3)` the transpose of
the keys' last two dimensions? That holds exactly when `keys` has four. Is
`torch.bmm(q, k)` a matrix of positions by positions? That holds when its
last two dimensions are both the flattened spatial positions of a feature
map (`h * w` of `b, c, h, w = x.shape`), and the contracted one is not.

The code states a shape in a few ways that survive ordinary code around them:

- the shape a `view`/`reshape`/`permute` gives it (`x.reshape(b, c, h * w)`:
  dimensions named `b`, `c`, `h*w`; `-1` or an expression: unnamed), or a
  shape unpacked from it (`b, h, t, d = x.shape`). In an unpacked 4-D or
  5-D shape the dimensions after the second are spatial: PyTorch's image
  layouts are NCHW and NCDHW (what `nn.Conv2d`/`nn.Conv3d` take and give);
- operations that keep the shape or move its dimensions: `transpose`,
  `permute`, casts, `contiguous`, `masked_fill`, a sign change; that keep
  the rank: `repeat_interleave` (grouped-query attention repeating the key
  heads), slices that only cut along dimensions (`x[..., :half]`),
  `torch.cat`; matrix products of two stated shapes;
- elementwise arithmetic with a tensor whose shape the code does not state:
  broadcasting adds leading dimensions only when that other tensor has
  more, and the tables multiplied into activations (positions, scales,
  masks) have fewer (`x * cos + rotated * sin`, rotary embeddings);
- the result of a function of the file (or a method of the class) whose
  body keeps its argument's shape through assignments and `if` blocks
  (`apply_rope(keys, cos, sin)`), and of a submodule the class builds as a
  layer that keeps its input's shape (`torch.nn` norms, dropout,
  activations, or a class of the file whose `forward` does: an `RMSNorm`).

Anything else is unknown (None): a shape is never guessed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.cst_helpers import bound_arguments, has_splat, method_call
from oom_lsp.analysis.rules._attention_evidence import method_named, statements_of
from oom_lsp.analysis.rules._scan import descendants

# Methods whose result has the receiver's shape.
_SAME_SHAPE_METHODS = frozenset({
    "contiguous", "float", "half", "bfloat16", "double", "to", "type", "type_as", "clone", "detach",
    "masked_fill", "masked_fill_", "softmax", "exp", "sqrt", "rsqrt", "neg", "abs", "pow", "mul", "add", "div",
    "sub",
})
# Methods whose result has the receiver's number of dimensions, some of other sizes.
_SAME_RANK_METHODS = frozenset({"repeat_interleave", "roll", "flip"})  # not expand/repeat: they may add dimensions
_SAME_SHAPE_FUNCTIONS = frozenset({"torch.exp", "torch.tanh", "torch.sigmoid", "torch.neg"})
_SAME_RANK_FUNCTIONS = frozenset({"torch.repeat_interleave", "torch.cat", "torch.concat", "torch.concatenate"})
_MATMUL = frozenset({"torch.bmm", "torch.matmul"})
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

# A dimension's name (`b`, `self.head_dim`, `h*w`, `64`), or None where the code does not name it.
Axis = str | None
Shape = tuple[Axis, ...]


_UNSET = object()

class Lookup(NamedTuple):
    """Where the code a call runs is found, asked afresh at each question (the
    rule's state is not kept here: no reference cycle outlives an analysis)."""

    callee: Callable[[cst.Call], cst.FunctionDef | None]  # a function of the file, a method of the class
    owner: cst.ClassDef | None  # the class being visited
    classes: Callable[[], dict[str, cst.ClassDef]]  # the file's classes by name (built when first asked)


class _Frame:
    def __init__(self) -> None:
        self.shapes: dict[str, Shape] = {}
        # The names of spatial dimensions unpacked from NCHW / NCDHW shapes.
        self.spatial: set[str] = set()


class TensorShapes:
    """Per function, the local names whose shape the code states; filled as the
    rule's visitor meets assignments, read at any expression."""

    def __init__(self, call_name: Callable[[cst.Call], str | None]) -> None:
        self._call_name = call_name
        # `self.<attr>` of a class -> the forward its layers share (or None).
        self._submodules: dict[tuple[int, str], cst.FunctionDef | None] = {}
        self._frames: list[_Frame] = [_Frame()]
        # Functions whose result is being worked out (no recursion).
        self._evaluating: set[int] = set()
        # What a function of the file returns called with nothing known, by id
        # (the functions kept alive here, so that an id stays theirs).
        self._stated_results: dict[int, object] = {}
        self._kept_alive: list[cst.FunctionDef] = []

    def enter(self) -> None:
        self._frames.append(_Frame())

    def leave(self) -> None:
        self._frames.pop()

    def rebind(self, targets: list[cst.BaseExpression], value: cst.BaseExpression, lookup: Lookup) -> None:
        frame = self._frames[-1]
        _bind(frame.shapes, targets, value, lambda expr, env: self._shape(expr, env, lookup), frame.spatial)

    def rank(self, expr: cst.BaseExpression, lookup: Lookup) -> int | None:
        shape = self._shape(expr, self._frames[-1].shapes, lookup)
        return None if shape is None else len(shape)

    def positions_by_positions(self, left: cst.BaseExpression, right: cst.BaseExpression, lookup: Lookup) -> bool:
        """Whether `left @ right` (3-D or more) is spatial positions by spatial
        positions: its last two dimensions both the same flattened positions of
        a feature map, contracted over another dimension (`q` as `(b, h*w, c)`
        times `k` as `(b, c, h*w)`). A Gram matrix of channels (`(b, c, c)`) is not."""
        env, spatial = self._frames[-1].shapes, self._frames[-1].spatial
        first, second = self._shape(left, env, lookup), self._shape(right, env, lookup)
        if first is None or second is None or len(first) != len(second) or len(first) < 3:
            return False
        rows, columns = first[-2], second[-1]
        if rows is None or rows != columns or not set(rows.split("*")) <= spatial:
            return False
        contracted = {first[-1], second[-2]} - {None}
        return len(contracted) <= 1 and rows not in contracted

    # --- the facts ------------------------------------------------------------
    def _shape(self, expr: cst.BaseExpression, env: dict[str, Shape], lookup: Lookup) -> Shape | None:
        def shape(sub: cst.BaseExpression) -> Shape | None:
            return self._shape(sub, env, lookup)

        if isinstance(expr, cst.Name):
            return env.get(expr.value)
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
            return shape(expr.expression)
        if isinstance(expr, cst.BinaryOperation):
            if isinstance(expr.operator, cst.MatrixMultiply):
                return _product(shape(expr.left), shape(expr.right))
            if isinstance(expr.operator, _ELEMENTWISE):
                return _broadcast(shape(expr.left), shape(expr.right))
            return None
        if isinstance(expr, cst.Subscript):
            # Slices and `...` cut along dimensions; an index or None changes the rank.
            if all(isinstance(element.slice, cst.Index) and isinstance(element.slice.value, cst.Ellipsis)
                   or isinstance(element.slice, cst.Slice) for element in expr.slice):
                return _unnamed(shape(expr.value))
            return None
        if not isinstance(expr, cst.Call) or has_splat(expr):
            return None
        name = self._call_name(expr)
        if name in _MATMUL and len(expr.args) == 2:
            return _product(shape(expr.args[0].value), shape(expr.args[1].value))
        if name in _SAME_RANK_FUNCTIONS and expr.args:
            first = expr.args[0].value
            if isinstance(first, (cst.Tuple, cst.List)):  # torch.cat((a, b), dim)
                ranks = {len(found) for element in first.elements if (found := shape(element.value)) is not None}
                return (None,) * ranks.pop() if len(ranks) == 1 else None
            return _unnamed(shape(first))
        if name in _SAME_SHAPE_FUNCTIONS and expr.args:
            return shape(expr.args[0].value)
        called = method_call(expr)
        if called is not None and name is None:
            receiver, method = called
            if method in ("view", "reshape"):
                return _stated_shape(expr)
            if method == "permute":
                return _permuted(shape(receiver), expr)
            if method in ("transpose", "swapaxes", "swapdims"):
                return _transposed(shape(receiver), expr)
            if method in ("bmm", "matmul") and len(expr.args) == 1:
                return _product(shape(receiver), shape(expr.args[0].value))
            if method in _SAME_SHAPE_METHODS:
                return shape(receiver)
            if method in _SAME_RANK_METHODS:
                return _unnamed(shape(receiver))
            if method in ("unsqueeze", "squeeze") and len(expr.args) == 1:
                base = shape(receiver)
                if base is None or (method == "squeeze" and not base):
                    return None
                return (None,) * (len(base) + (1 if method == "unsqueeze" else -1))
        if name is None:
            return self._result_shape(expr, env, lookup)
        return None

    def _result_shape(self, call: cst.Call, env: dict[str, Shape], lookup: Lookup) -> Shape | None:
        """The shape a call of the file's own code returns, given its arguments."""
        if all(self._shape(arg.value, env, lookup) is None for arg in call.args):
            # No argument's shape is known (most calls): only a function of the
            # file that states the shape it returns whatever it is given
            # (`return t.view(b, n, h, d).transpose(1, 2).reshape(b * h, n, d)`)
            # has one. Worked out once per function.
            function = lookup.callee(call)
            if function is None or id(function) in self._evaluating:
                return None
            known = self._stated_results.get(id(function), _UNSET)
            if known is _UNSET:
                self._evaluating.add(id(function))
                try:
                    known = self._body_result(function, {}, lookup)
                finally:
                    self._evaluating.discard(id(function))
                self._stated_results[id(function)] = known
                self._kept_alive.append(function)
            return known  # type: ignore[return-value]
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
        bound = {
            name: found
            for name, value in bound_arguments(call, params).items()
            if (found := self._shape(value, env, lookup)) is not None
        }
        self._evaluating.add(id(function))
        try:
            return self._body_result(function, bound, lookup)
        finally:
            self._evaluating.discard(id(function))

    def _body_result(self, function: cst.FunctionDef, env: dict[str, Shape], lookup: Lookup) -> Shape | None:
        """The shape of what a body of assignments and `if` blocks returns (the
        shapes after an `if` are those both ways agree on); a loop, or a
        `return` inside a branch, could change it: unknown."""
        try:
            returned = self._run(statements_of(function.body), env, lookup)
        except _Unknown:
            return None
        return returned[0] if returned is not None else None

    def _run(self, statements: Sequence[cst.CSTNode], env: dict[str, Shape],
             lookup: Lookup) -> tuple[Shape | None] | None:
        """Runs a block over `env`: (shape,) when it returns, None when it falls
        through; raises _Unknown where it cannot follow."""
        def shape(expr: cst.BaseExpression, e: dict[str, Shape]) -> Shape | None:
            return self._shape(expr, e, lookup)

        for statement in statements:
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if isinstance(small, cst.Return):
                        return (None if small.value is None else shape(small.value, env),)
                    if isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is not None:
                        targets = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
                        _bind(env, targets, small.value, shape, set())
                    # `x *= scale` (elementwise: the shape stays), asserts, calls.
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
                env.update({name: found for name, found in taken.items() if other.get(name) == found})
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


def _bind(env: dict[str, Shape], targets: list[cst.BaseExpression], value: cst.BaseExpression,
          shape: Callable[[cst.BaseExpression, dict[str, Shape]], Shape | None], spatial: set[str]) -> None:
    for target in targets:
        if isinstance(target, cst.Name):
            _bind_one(env, target, shape(value, env))
            continue
        elements = target.elements if isinstance(target, (cst.Tuple, cst.List)) else None
        if elements is not None and not any(isinstance(e, cst.StarredElement) for e in elements):
            shape_of = _unpacked_shape(value)
            if shape_of is not None:
                # `b, c, h, w = x.shape`: x has as many dimensions as names, named so.
                names = tuple(e.value.value if isinstance(e.value, cst.Name) and e.value.value != "_" else None
                              for e in elements)
                for element in elements:
                    _bind_one(env, element.value, None)
                env[shape_of] = names
                if len(names) in (4, 5):
                    spatial.update(name for name in names[2:] if name is not None)
                continue
            if isinstance(value, (cst.Tuple, cst.List)) and len(value.elements) == len(elements) and not any(
                isinstance(e, cst.StarredElement) for e in value.elements
            ):
                # `keys, values = keys_new, values_new`: pairwise.
                found = [shape(e.value, env) for e in value.elements]
                for element, element_shape in zip(elements, found):
                    _bind_one(env, element.value, element_shape)
                continue
            each = _comprehension_element_shape(value, env, shape)
            if each is not None:
                # `q, k, v = (t.view(b, n, h, d).transpose(1, 2) for t in qkv.chunk(3, -1))`:
                # every element is made the same way, so each name has its shape.
                for element in elements:
                    _bind_one(env, element.value, each)
                continue
        _bind_one(env, target, None)


def _comprehension_element_shape(
    value: cst.BaseExpression,
    env: dict[str, Shape],
    shape: Callable[[cst.BaseExpression, dict[str, Shape]], Shape | None],
) -> Shape | None:
    """The shape every element of `(f(t) for t in xs)` (or a list
    comprehension) has, when `f` states it whatever `t` is: one `for`, no
    condition, the element's shape worked out without knowing `t`."""
    if not isinstance(value, (cst.GeneratorExp, cst.ListComp)):
        return None
    loop = value.for_in
    if loop.inner_for_in is not None or loop.ifs or not isinstance(loop.target, cst.Name):
        return None
    inner = {name: known for name, known in env.items() if name != loop.target.value}
    return shape(value.elt, inner)


def _bind_one(env: dict[str, Shape], target: cst.BaseExpression, found: Shape | None) -> None:
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


def _axis(expr: cst.BaseExpression) -> Axis:
    """A dimension's name: `b`, `self.head_dim`, `64`, `h*w` (factors sorted)."""
    if isinstance(expr, cst.Integer):
        return None if expr.value.startswith("-") else expr.value
    if isinstance(expr, (cst.Name, cst.Attribute)):
        return dotted_name(expr)
    if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.Multiply):
        factors = [_axis(expr.left), _axis(expr.right)]
        if None in factors:
            return None
        return "*".join(sorted(part for factor in factors for part in factor.split("*")))  # type: ignore[union-attr]
    return None


def _stated_shape(call: cst.Call) -> Shape | None:
    """The shape `view`/`reshape` states."""
    args = [arg.value for arg in call.args if arg.keyword is None]
    if len(args) == 1 and isinstance(args[0], (cst.Tuple, cst.List)):
        if any(isinstance(element, cst.StarredElement) for element in args[0].elements):
            return None
        return tuple(_axis(element.value) for element in args[0].elements)
    if len(args) == 1:
        return None  # a dtype or a shape variable
    return tuple(_axis(arg) for arg in args) if len(args) == len(call.args) else None


def _dims(call: cst.Call) -> list[int] | None:
    args = [arg.value for arg in call.args if arg.keyword is None]
    if len(args) == 1 and isinstance(args[0], (cst.Tuple, cst.List)):
        args = [element.value for element in args[0].elements]
    dims = []
    for arg in args:
        if isinstance(arg, cst.Integer):
            dims.append(int(arg.value))
        elif isinstance(arg, cst.UnaryOperation) and isinstance(arg.operator, cst.Minus) and isinstance(arg.expression, cst.Integer):
            dims.append(-int(arg.expression.value))
        else:
            return None
    return dims if len(args) == len(call.args) or len(call.args) == 1 else None


def _permuted(base: Shape | None, call: cst.Call) -> Shape | None:
    dims = _dims(call)
    if dims is None:
        args = [arg for arg in call.args if arg.keyword is None]
        return (None,) * len(args) if len(args) > 1 and len(args) == len(call.args) else None
    if base is None or len(base) != len(dims) or sorted(d % len(base) for d in dims) != list(range(len(base))):
        return (None,) * len(dims)
    return tuple(base[d % len(base)] for d in dims)


def _transposed(base: Shape | None, call: cst.Call) -> Shape | None:
    dims = _dims(call)
    if base is None:
        return None
    if dims is None or len(dims) != 2 or not all(-len(base) <= d < len(base) for d in dims):
        return _unnamed(base)
    first, second = (d % len(base) for d in dims)
    swapped = list(base)
    swapped[first], swapped[second] = swapped[second], swapped[first]
    return tuple(swapped)


def _product(left: Shape | None, right: Shape | None) -> Shape | None:
    """`left @ right` of two stated shapes of the same rank (batched matrices)."""
    if left is None or right is None or len(left) != len(right) or len(left) < 2:
        return None
    return left[:-1] + right[-1:]


def _broadcast(left: Shape | None, right: Shape | None) -> Shape | None:
    if left is None or right is None:
        return left if right is None else right
    if len(left) != len(right):
        return (None,) * max(len(left), len(right))
    return tuple(a if a == b else None for a, b in zip(left, right))


def _unnamed(shape: Shape | None) -> Shape | None:
    return None if shape is None else (None,) * len(shape)
