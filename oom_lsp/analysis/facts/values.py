"""What a plain expression evaluates to, when the code says so.

A small abstract interpreter over libcst expressions for the values sizes
are made of: numbers, strings, tuples and lists of them, configs (dict
literals, namespaces, dataclass instances, classes with attributes, argparse
results), instances of the file's classes, and library configs
(`GPT2Config(n_layer=12)`). Names are followed through `FileIndex.reaching`
(one binding, or the one that dominates the use); parameters read the
arguments bound at an instantiation site when there is one (a `Frame`), or
else their defaults, labelled as defaults. Everything else is unknown (None),
and so is anything past a step budget: a query costs at most a few thousand
node visits.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import libcst as cst

from oom_lsp.analysis.context import FileContext, dotted_name
from oom_lsp.analysis.facts.bindings import AMBIGUOUS, Binding, BindingKind, FileIndex, Scope

# --- abstract values ------------------------------------------------------------------


@dataclass(frozen=True)
class Known:
    """A number, bool, string or None; `evidence` names the figures it came from."""

    value: int | float | bool | str | None
    evidence: tuple[str, ...] = ()
    default: bool = False


@dataclass(frozen=True)
class Items:
    """A tuple or list literal (or `range`), element by element (None: unknown)."""

    items: tuple[object, ...]
    evidence: tuple[str, ...] = ()
    default: bool = False


@dataclass(frozen=True, eq=False)
class Record:
    """Named fields: a dict literal, a namespace, a dataclass instance, a
    class's attributes. A field is an unevaluated `(expr, frame)` or a value."""

    fields: Mapping[str, object]
    # Fields whose value is a declared default (a dataclass field's, when an
    # argument parser fills the instance).
    default_fields: frozenset[str] = frozenset()
    label: str = "config"


@dataclass(frozen=True)
class ArgNamespace:
    """The result of `parser.parse_args()`: its attributes are the file's argparse options."""


@dataclass(frozen=True)
class Definition:
    node: cst.FunctionDef | cst.ClassDef


@dataclass(frozen=True, eq=False)
class Instance:
    """An instance of a class of the file, with its `__init__` frame."""

    cls: cst.ClassDef
    frame: Frame | None


@dataclass(frozen=True, eq=False)
class LibraryConfig:
    """A library's config object built in code: `GPT2Config(n_layer=12)`,
    `AutoConfig.from_pretrained("gpt2", n_layer=6)` (`checkpoint` "gpt2")."""

    class_name: str
    fields: Mapping[str, object]
    checkpoint: str | None = None
    evidence: tuple[str, ...] = ()
    default: bool = False


Value = Known | Items | Record | ArgNamespace | Definition | Instance | LibraryConfig


@dataclass(frozen=True, eq=False)
class Frame:
    """Where an expression is evaluated: its scope, and for a function entered
    from an instantiation site, the arguments bound to its parameters."""

    scope: Scope
    # Parameter -> (argument expression, caller frame). None: entered from
    # nowhere in particular: parameters read their defaults.
    arguments: Mapping[str, tuple[cst.BaseExpression, Frame]] | None = None
    # The call passed `*args` / `**kwargs`: an unbound parameter is unknown.
    splat: bool = False
    # Names bound by the evaluation itself (a comprehension's variable).
    overlay: Mapping[str, object] = field(default_factory=dict)
    # For a method: the frame of `self`'s `__init__`.
    owner: Frame | None = None
    depth: int = 0


class BudgetExceeded(Exception):
    """A query visited more nodes than it may: its answer is unknown."""


_STEP_BUDGET = 4000
_MAX_DEPTH = 6

_ARITHMETIC: dict[type, Callable[[object, object], object]] = {
    cst.Add: operator.add,
    cst.Subtract: operator.sub,
    cst.Multiply: operator.mul,
    cst.FloorDivide: operator.floordiv,
    cst.Divide: operator.truediv,
    cst.Modulo: operator.mod,
    cst.Power: operator.pow,
    cst.LeftShift: operator.lshift,
    cst.RightShift: operator.rshift,
}
_AUGMENTED: dict[type, type] = {
    cst.AddAssign: cst.Add,
    cst.SubtractAssign: cst.Subtract,
    cst.MultiplyAssign: cst.Multiply,
    cst.FloorDivideAssign: cst.FloorDivide,
    cst.DivideAssign: cst.Divide,
    cst.ModuloAssign: cst.Modulo,
    cst.PowerAssign: cst.Power,
    cst.LeftShiftAssign: cst.LeftShift,
    cst.RightShiftAssign: cst.RightShift,
}
# Wrappers that make attribute access of a dict (`cfg.model.dim`).
_DICT_WRAPPERS = frozenset({"EasyDict", "edict", "create", "ConfigDict", "Box", "AttrDict", "Munch", "DotMap", "DictConfig"})
_NAMESPACES = frozenset({"types.SimpleNamespace", "argparse.Namespace", "SimpleNamespace", "Namespace"})
_DATACLASS_DECORATORS = frozenset({"dataclass", "dataclasses.dataclass", "attr.s", "attrs.define", "define", "frozen"})
_CONFIG_BASES = ("BaseModel", "NamedTuple", "BaseSettings", "TypedDict")
_NUMERIC_FUNCTIONS: dict[str, Callable[..., object]] = {
    "int": int,
    "float": float,
    "abs": abs,
    "round": round,
    "max": max,
    "min": min,
    "math.ceil": math.ceil,
    "math.floor": math.floor,
    "math.sqrt": math.sqrt,
    "math.prod": lambda *items: math.prod(items),
    "math.log2": math.log2,
}
# Magnitudes past which arithmetic stops (a `2 ** 10 ** 10` in a file must not hang the analyzer).
_LARGEST = 1 << 80


def parameters_of(function: cst.FunctionDef) -> dict[str, cst.Param]:
    params = function.params
    found = {}
    for param in (*params.posonly_params, *params.params, *params.kwonly_params):
        found[param.name.value] = param
    return found


def positional_parameters(function: cst.FunctionDef) -> list[cst.Param]:
    return [*function.params.posonly_params, *function.params.params]


class Evaluator:
    """Evaluates expressions of one file (see the module docstring)."""

    def __init__(self, context: FileContext, index: FileIndex) -> None:
        self.context = context
        self.index = index
        self.module_frame = Frame(scope=None)
        self._unbound_frames: dict[Scope, Frame] = {None: self.module_frame}
        self.steps = 0
        # The tensor facts plug in here, so that `x.shape[0]` and `x.size(1)` evaluate.
        self.shape_of: Callable[[cst.BaseExpression, Frame], tuple[int | None, ...] | None] | None = None
        # The call graph plugs in here: what the file's callers pass for a parameter of a
        # function entered from nowhere in particular, as (argument, the caller's scope).
        self.passed_by_callers: Callable[[cst.FunctionDef, str], list[tuple[cst.BaseExpression, Scope]]] | None = None

    # --- frames -------------------------------------------------------------------------
    def frame_for(self, scope: Scope) -> Frame:
        """The frame of a scope entered from nowhere in particular (parameters at their defaults)."""
        frame = self._unbound_frames.get(scope)
        if frame is None:
            owner = None
            cls = self.index.class_of_method.get(scope) if type(scope) is cst.FunctionDef else None
            if cls is not None and scope.name.value != "__init__":
                init = self.find_method(cls, "__init__")
                owner = self.frame_for(init[1]) if init else None
            frame = self._unbound_frames[scope] = Frame(scope=scope, owner=owner)
        return frame

    def step(self, frame: Frame) -> None:
        self.steps += 1
        if self.steps > _STEP_BUDGET or frame.depth > _MAX_DEPTH:
            raise BudgetExceeded

    def enter(
        self,
        function: cst.FunctionDef,
        call: cst.Call | None,
        caller: Frame,
        *,
        skip_self: bool,
        owner: Frame | None = None,
    ) -> Frame:
        """The frame of `function` called by `call` from `caller`."""
        arguments: dict[str, tuple[cst.BaseExpression, Frame]] = {}
        splat = False
        if call is not None:
            positional = positional_parameters(function)
            if skip_self and positional:
                positional = positional[1:]
            index = 0
            for arg in call.args:
                if arg.star:
                    splat = True
                    continue
                if arg.keyword is not None:
                    arguments[arg.keyword.value] = (arg.value, caller)
                elif index < len(positional):
                    arguments[positional[index].name.value] = (arg.value, caller)
                    index += 1
        frame = Frame(
            scope=function, arguments=arguments, splat=splat, owner=owner, depth=caller.depth + 1
        )
        return frame

    # --- evaluation -----------------------------------------------------------------
    def evaluate(self, expr: cst.BaseExpression, frame: Frame) -> Value | None:
        self.step(frame)
        kind = type(expr)
        if kind is cst.Integer:
            return Known(int(expr.value.replace("_", ""), 0))
        if kind is cst.Float:
            return Known(float(expr.value.replace("_", "")))
        if kind is cst.SimpleString or kind is cst.ConcatenatedString:
            value = expr.evaluated_value
            return Known(value) if isinstance(value, str) else None
        if kind is cst.Name:
            if expr.value in ("True", "False", "None"):
                return Known({"True": True, "False": False, "None": None}[expr.value])
            return self.name(expr, frame)
        if kind is cst.Attribute:
            return self.attribute(expr, frame)
        if kind is cst.Subscript:
            return self.subscript(expr, frame)
        if kind is cst.BinaryOperation:
            return self.arithmetic(expr.operator, self.evaluate(expr.left, frame), self.evaluate(expr.right, frame))
        if kind is cst.UnaryOperation:
            inner = self.evaluate(expr.expression, frame)
            if type(inner) is Known and isinstance(inner.value, (int, float)) and not isinstance(inner.value, bool):
                if type(expr.operator) is cst.Minus:
                    return Known(-inner.value, inner.evidence, inner.default)
                if type(expr.operator) is cst.Plus:
                    return inner
            return None
        if kind is cst.Tuple or kind is cst.List:
            if any(type(element) is cst.StarredElement for element in expr.elements):
                return None
            values = tuple(self.evaluate(element.value, frame) for element in expr.elements)
            return Items(values, _evidence_of(values), any(_is_default(value) for value in values))
        if kind is cst.Dict:
            fields: dict[str, object] = {}
            for element in expr.elements:
                if type(element) is not cst.DictElement:
                    return None
                key = self.evaluate(element.key, frame)
                if type(key) is not Known or not isinstance(key.value, str):
                    return None
                fields[key.value] = (element.value, frame)
            return Record(fields)
        if kind is cst.Call:
            return self.call(expr, frame)
        if kind is cst.IfExp:
            body, orelse = self.evaluate(expr.body, frame), self.evaluate(expr.orelse, frame)
            if type(body) is Known and type(orelse) is Known and body.value == orelse.value:
                return body
            return None
        return None

    def value_of(self, item: object, label: str | None = None) -> Value | None:
        """A record field or bound argument: `(expr, frame)` evaluated, or the value itself."""
        if type(item) is tuple:
            expr, frame = item
            value = self.evaluate(expr, frame)
        else:
            value = item  # type: ignore[assignment]
        return _labelled(value, label) if label else value

    def arithmetic(self, op: cst.BaseBinaryOp, left: Value | None, right: Value | None) -> Value | None:
        if type(left) is not Known or type(right) is not Known:
            if type(op) is cst.Multiply and type(left) is Items and type(right) is Known:
                if isinstance(right.value, int) and 0 <= right.value <= 1024:
                    return Items(left.items * right.value, left.evidence + right.evidence, left.default or right.default)
            return None
        a, b = left.value, right.value
        function = _ARITHMETIC.get(type(op))
        if function is None:
            return None
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            if type(op) is cst.Power and (abs(b) > 256 or abs(a) > _LARGEST):
                return None
            if type(op) is cst.LeftShift and (not isinstance(b, int) or b > 80):
                return None
            try:
                result = function(a, b)
            except (ZeroDivisionError, OverflowError, ValueError, TypeError):
                return None
            if isinstance(result, complex) or (isinstance(result, (int, float)) and abs(result) > _LARGEST):
                return None
        elif isinstance(a, str) and isinstance(b, str) and type(op) is cst.Add:
            result = a + b
        else:
            return None
        return Known(result, _merge(left.evidence, right.evidence), left.default or right.default)

    # --- names ------------------------------------------------------------------------
    def name(self, expr: cst.Name, frame: Frame) -> Value | None:
        return self.lookup(expr.value, expr, frame)

    def find(self, name: str, use: cst.CSTNode | None, frame: Frame) -> tuple[Binding | cst.Param, Frame] | None:
        """The binding (or parameter) that gives `name` its value at `use`, and its frame."""
        scope = frame.scope
        params = parameters_of(scope) if type(scope) is cst.FunctionDef else {}
        binding = self.index.reaching(name, scope, use, parameter=name in params)
        if binding is AMBIGUOUS:
            return None
        if binding is not None:
            return binding, frame
        if name in params:
            return params[name], frame
        if scope is None:
            return None
        # Free in this scope: the enclosing function's binding at the `def`, or the module's.
        definition: cst.CSTNode = scope
        outer = self.index.enclosing_scope(scope)
        while type(outer) is cst.ClassDef:
            definition = outer
            outer = self.index.enclosing_scope(outer)
        if outer is None:
            binding = self.index.reaching(name, None, None)
            return (binding, self.module_frame) if type(binding) is Binding else None
        return self.find(name, definition, self.frame_for(outer))

    def lookup(self, name: str, use: cst.CSTNode | None, frame: Frame) -> Value | None:
        if name in frame.overlay:
            return frame.overlay[name]  # type: ignore[return-value]
        found = self.find(name, use, frame)
        if found is None:
            return None
        target, where = found
        if type(target) is cst.Param:
            return self.parameter(target, where)
        return self.binding_value(target, where, name)

    def resolve(self, expr: cst.BaseExpression, frame: Frame) -> tuple[cst.BaseExpression, Frame] | None:
        """The expression a name or attribute is bound to, and the frame to
        evaluate it in (for facts that read the constructor, not a value)."""
        if type(expr) is cst.Name:
            if expr.value in frame.overlay:
                return None
            found = self.find(expr.value, expr, frame)
        elif type(expr) is cst.Attribute:
            dotted = dotted_name(expr)
            found = self.find_dotted(dotted, expr, frame) if dotted else None
        else:
            return None
        if found is None:
            return None
        target, where = found
        if type(target) is cst.Param:
            name = target.name.value
            if where.arguments is not None and name in where.arguments:
                return where.arguments[name]
            if where.splat or target.default is None:
                return None
            return target.default, self.default_frame(where.scope)
        if target.kind is BindingKind.VALUE:
            scope = self.index.scope_of.get(target.statement)
            return target.value, (where if scope is where.scope else self.frame_for(scope))
        return None

    def binding_value(self, binding: Binding, frame: Frame, label: str) -> Value | None:
        scope = self.index.scope_of.get(binding.statement)
        if scope is not frame.scope:
            frame = self.frame_for(scope)
        kind = binding.kind
        if kind is BindingKind.VALUE:
            return _labelled(self.evaluate(binding.value, frame), label)
        if kind is BindingKind.FUNCTION or kind is BindingKind.CLASS:
            return Definition(binding.definition)
        if kind is BindingKind.AUGMENTED:
            before = self.lookup(binding.name, binding.statement, frame) if "." not in binding.name else None
            op = _AUGMENTED.get(type(binding.operator))
            if op is None:
                return None
            return _labelled(self.arithmetic(op(), before, self.evaluate(binding.value, frame)), label)
        if kind is BindingKind.UNPACKED:
            value = self.evaluate(binding.value, frame)
            if type(value) is Items and binding.index < len(value.items):
                return _labelled(value.items[binding.index], label)
            return None
        return None

    def default_frame(self, function: Scope) -> Frame:
        """Where a parameter's default is evaluated: the scope around the `def`."""
        outer = self.index.enclosing_scope(function) if function is not None else None
        return self.module_frame if type(outer) is cst.ClassDef else self.frame_for(outer)

    def parameter(self, param: cst.Param, frame: Frame) -> Value | None:
        name = param.name.value
        if frame.arguments is not None and name in frame.arguments:
            expr, caller = frame.arguments[name]
            return _labelled(self.evaluate(expr, caller), name)
        if frame.arguments is None and type(frame.scope) is cst.FunctionDef and self.passed_by_callers is not None:
            # Entered from nowhere in particular: every caller the file shows passes the same value.
            passed = self.passed_by_callers(frame.scope, name)
            values = [self.evaluate(expr, self.frame_for(scope)) for expr, scope in passed]
            agreed = _agreed(values) if values else None
            if agreed is not None:
                return _labelled(agreed, name)
        if frame.splat or param.default is None:
            return None
        value = self.evaluate(param.default, self.default_frame(frame.scope))
        if frame.arguments is None:
            return _as_default(value, f"{name}={{}} (parameter default)")
        return _labelled(value, name)  # the instantiation site left the default

    # --- attributes, subscripts ----------------------------------------------------------
    def attribute(self, expr: cst.Attribute, frame: Frame) -> Value | None:
        dotted = dotted_name(expr)
        if dotted is not None:
            head, _, rest = dotted.partition(".")
            if head == "self" and frame.scope in self.index.class_of_method:
                attribute, _, deeper = rest.partition(".")
                found = self.find_self(attribute, expr, frame)
                if found is not None:
                    binding, where = found
                    return self.member(self.binding_value(binding, where, f"self.{attribute}"), deeper, dotted)
                if found is None and self.self_bound(attribute, frame):
                    return None
                cls = self.index.class_of_method[frame.scope]
                return self.member(self.class_attribute(cls, attribute), deeper, dotted)
            found = self.find_dotted(dotted, expr, frame)
            if found is not None:
                binding, where = found
                if type(binding) is Binding:
                    return self.binding_value(binding, where, dotted)
        if expr.attr.value == "shape" and self.shape_of is not None:
            return self.dimension(expr.value, None, frame)
        base = self.evaluate(expr.value, frame)
        return self.member(base, expr.attr.value, dotted or expr.attr.value)

    def find_dotted(self, dotted: str, use: cst.CSTNode, frame: Frame) -> tuple[Binding, Frame] | None:
        """A binding of the path itself: `cfg.model.dim = 512`, `self.dim = dim`."""
        head, _, rest = dotted.partition(".")
        scope = frame.scope
        if head == "self" and scope in self.index.class_of_method:
            if "." in rest:
                return None
            return self.find_self(rest, use, frame)
        binding = self.index.reaching(dotted, scope, use)
        if binding is None and scope is not None and not self.index.bindings_of(head, scope):
            binding = self.index.reaching(dotted, None, None)
            frame = self.module_frame
        if type(binding) is not Binding:
            return None
        return binding, frame

    def self_bound(self, attribute: str, frame: Frame) -> bool:
        cls = self.index.class_of_method[frame.scope]
        return any(attribute in self.index.self_bindings.get(owner, {}) for owner in self.lineage(cls))

    def find_self(self, attribute: str, use: cst.CSTNode, frame: Frame) -> tuple[Binding, Frame] | None:
        """`self.<attribute>` in a method: the binding `__init__` makes, in the
        frame of `self`'s `__init__`. An attribute another method rebinds is unknown."""
        method = frame.scope
        cls = self.index.class_of_method[method]
        bindings = [
            binding
            for owner in self.lineage(cls)
            for binding in self.index.self_bindings.get(owner, {}).get(attribute, [])
        ]
        init = self.find_method(cls, "__init__")
        if not bindings or init is None:
            return None
        if any(self.index.scope_of.get(b.statement) is not init[1] for b in bindings):
            return None
        if method is init[1]:
            binding = self.index.reaching(f"self.{attribute}", method, use)
            return (binding, frame) if type(binding) is Binding else None
        if len(bindings) != 1:
            return None
        return bindings[0], frame.owner or self.frame_for(init[1])

    def class_attribute(self, cls: cst.ClassDef, name: str) -> Value | None:
        for owner in self.lineage(cls):
            bindings = self.index.bindings_of(name, owner)
            if len(bindings) == 1:
                return self.binding_value(bindings[0], self.frame_for(owner), name)
            if bindings:
                return None
        return None

    def member(self, base: Value | None, name: str, label: str) -> Value | None:
        if not name:
            return base
        kind = type(base)
        if kind is Record:
            if name not in base.fields:
                return None
            value = self.value_of(base.fields[name])
            if name in base.default_fields:
                return _as_default(value, f"{label}={{}} ({base.label} default)")
            return _labelled(value, label)
        if kind is ArgNamespace:
            return self.option_default(name)
        if kind is Instance:
            init = self.find_method(base.cls, "__init__")
            if init is not None:
                bindings = [
                    binding
                    for owner in self.lineage(base.cls)
                    for binding in self.index.self_bindings.get(owner, {}).get(name, [])
                ]
                if len(bindings) == 1 and self.index.scope_of.get(bindings[0].statement) is init[1]:
                    return self.binding_value(bindings[0], base.frame or self.frame_for(init[1]), label)
                if bindings:
                    return None
            return self.class_attribute(base.cls, name)
        if kind is Definition and type(base.node) is cst.ClassDef:
            return self.class_attribute(base.node, name)
        if kind is LibraryConfig:
            value = base.fields.get(name)
            return _labelled(self.value_of(value), label) if value is not None else None
        return None

    def subscript(self, expr: cst.Subscript, frame: Frame) -> Value | None:
        if len(expr.slice) != 1 or type(expr.slice[0].slice) is not cst.Index:
            return None
        index_expr = expr.slice[0].slice.value
        dotted = dotted_name(expr.value)
        key = self.evaluate(index_expr, frame)
        if dotted is not None and type(key) is Known and isinstance(key.value, str) and key.value.isidentifier():
            found = self.find_dotted(f"{dotted}.{key.value}", expr, frame)
            if found is not None:
                return self.binding_value(found[0], found[1], f"{dotted}[{key.value!r}]")
        # `x.shape[0]`: a tensor's dimension.
        if type(expr.value) is cst.Attribute and expr.value.attr.value == "shape" and self.shape_of is not None:
            shape = self.shape_of(expr.value.value, frame)
            if shape is not None and type(key) is Known and type(key.value) is int:
                try:
                    dim = shape[key.value]
                except IndexError:
                    return None
                return Known(dim) if dim is not None else None
            return None
        base = self.evaluate(expr.value, frame)
        if type(key) is not Known:
            return None
        label = f"{dotted}[{key.value!r}]" if dotted else None
        if type(base) is Items and type(key.value) is int:
            try:
                return _labelled(base.items[key.value], label)  # type: ignore[arg-type]
            except IndexError:
                return None
        if type(base) is Record and isinstance(key.value, str):
            return self.member(base, key.value, label or key.value)
        if type(base) is Known and isinstance(base.value, str) and type(key.value) is int:
            return None
        return None

    def dimension(
        self, tensor: cst.BaseExpression, index: cst.BaseExpression | None, frame: Frame, *, whole: bool = False
    ) -> Value | None:
        """`x.size(0)`, `x.size()`, `x.numel()` of a tensor the code builds."""
        shape = self.shape_of(tensor, frame) if self.shape_of is not None else None
        if shape is None:
            return None
        if whole:
            return Known(math.prod(shape)) if None not in shape else None  # type: ignore[arg-type]
        if index is None:
            return Items(tuple(Known(dim) if dim is not None else None for dim in shape))
        key = self.evaluate(index, frame)
        if type(key) is not Known or type(key.value) is not int:
            return None
        try:
            dim = shape[key.value]
        except IndexError:
            return None
        return Known(dim) if dim is not None else None

    # --- calls ------------------------------------------------------------------------
    def call(self, expr: cst.Call, frame: Frame) -> Value | None:
        func = expr.func
        qualified = self.context.qualified_name(func)
        dotted = dotted_name(func)
        name = qualified or dotted
        args = expr.args
        if name in ("len",) and len(args) == 1:
            value = self.evaluate(args[0].value, frame)
            if type(value) is Items:
                return Known(len(value.items), value.evidence, value.default)
            if type(value) is Known and isinstance(value.value, str):
                return Known(len(value.value), value.evidence, value.default)
            if type(value) is Record:
                return Known(len(value.fields))
            return None
        if name == "range":
            bounds = [self.evaluate(arg.value, frame) for arg in args if not arg.star and arg.keyword is None]
            numbers = [b.value for b in bounds if type(b) is Known and type(b.value) is int]
            if len(numbers) != len(bounds) or not 1 <= len(numbers) <= 3 or len(range(*numbers)) > 4096:
                return None
            return Items(tuple(Known(i) for i in range(*numbers)), _evidence_of(bounds), any(_is_default(b) for b in bounds))
        if name in _NUMERIC_FUNCTIONS and args and not any(arg.star or arg.keyword for arg in args):
            values = [self.evaluate(arg.value, frame) for arg in args]
            if not all(type(v) is Known and isinstance(v.value, (int, float, str)) for v in values):
                return None
            try:
                result = _NUMERIC_FUNCTIONS[name](*[v.value for v in values])
            except (TypeError, ValueError, OverflowError):
                return None
            evidence = _merge(*[v.evidence for v in values])
            return Known(result, evidence, any(v.default for v in values))
        if name in ("os.getenv", "os.environ.get") and len(args) == 2:
            variable, default = self.evaluate(args[0].value, frame), self.evaluate(args[1].value, frame)
            if type(variable) is Known and type(default) is Known:
                return _as_default(default, f"{variable.value}={{}} (environment default)")
            return None
        if name == "dict" or name in _NAMESPACES:
            if any(arg.star for arg in args) or any(arg.keyword is None for arg in args):
                return None
            return Record({arg.keyword.value: (arg.value, frame) for arg in args})
        last = (name or "").rpartition(".")[2]
        if last in _DICT_WRAPPERS and len(args) == 1 and args[0].keyword is None and not args[0].star:
            inner = self.evaluate(args[0].value, frame)
            return inner if type(inner) is Record else None
        if type(func) is cst.Attribute:
            method = func.attr.value
            if method in ("size", "numel") and self.shape_of is not None and len(args) <= 1:
                return self.dimension(func.value, args[0].value if args else None, frame, whole=method == "numel")
            if method == "parse_args":
                return ArgNamespace()
            if method == "parse_known_args":
                return Items((ArgNamespace(), None))
            if method == "get" and len(args) == 2:
                base = self.evaluate(func.value, frame)
                key = self.evaluate(args[0].value, frame)
                if type(base) is Record and type(key) is Known and isinstance(key.value, str):
                    if key.value in base.fields:
                        return self.member(base, key.value, f"{dotted_name(func.value)}[{key.value!r}]")
                    return self.evaluate(args[1].value, frame)
                return None
            if method == "parse_args_into_dataclasses":
                return self.parsed_dataclasses(func.value, frame)
        if last.endswith("Config") and last[:1].isupper() and qualified is not None:
            return self.library_config(expr, last, frame)
        if last == "from_pretrained" and type(func) is cst.Attribute:
            owner = dotted_name(func.value) or ""
            owner_last = (self.context.qualified_name(func.value) or owner).rpartition(".")[2]
            if owner_last.endswith("Config"):
                return self.library_config(expr, owner_last, frame, pretrained=True)
        target = self.evaluate(func, frame) if type(func) in (cst.Name, cst.Attribute) and qualified is None else None
        if type(target) is Definition:
            return self.call_definition(target.node, expr, frame)
        return None

    def call_definition(self, node: cst.FunctionDef | cst.ClassDef, call: cst.Call, frame: Frame) -> Value | None:
        if type(node) is cst.ClassDef:
            if self.is_record_class(node):
                return self.dataclass_record(node, call, frame)
            init = self.find_method(node, "__init__")
            if init is None:
                return Instance(node, None)
            return Instance(node, self.enter(init[1], call, frame, skip_self=True))
        if node in self.index.class_of_method:
            return None  # a method called through its class: rare, unknown
        callee = self.enter(node, call, frame, skip_self=False)
        return self.returned(node, callee)

    def returned(self, function: cst.FunctionDef, frame: Frame) -> Value | None:
        """The value a function returns, when all its `return`s agree."""
        results = self.return_expressions(function)
        if not results:
            return None
        values = [self.evaluate(expr, frame) for expr in results]
        first = values[0]
        if all(value == first for value in values[1:]):
            return first
        return None

    def return_expressions(self, function: cst.FunctionDef) -> list[cst.BaseExpression]:
        found = []
        for statement in self.index.statements.get(function, ()):
            if type(statement) is not cst.SimpleStatementLine:
                continue
            for small in statement.body:
                if type(small) is cst.Return:
                    if small.value is None:
                        return []
                    found.append(small.value)
        return found

    def find_method(self, cls: cst.ClassDef, name: str) -> tuple[cst.ClassDef, cst.FunctionDef] | None:
        for owner in self.lineage(cls):
            method = self.index.methods.get(owner, {}).get(name)
            if method is not None:
                return owner, method
        return None

    def lineage(self, cls: cst.ClassDef) -> list[cst.ClassDef]:
        """The class and its bases that are classes of the file (first bases first)."""
        chain = [cls]
        current = cls
        while len(chain) < 8:
            for base in current.bases:
                if base.keyword is not None:
                    continue
                name = dotted_name(base.value)
                found = self.index.classes.get(name) if name else None
                if found is not None and found not in chain:
                    chain.append(found)
                    current = found
                    break
            else:
                break
        return chain

    def is_record_class(self, cls: cst.ClassDef) -> bool:
        for decorator in cls.decorators:
            target = decorator.decorator.func if type(decorator.decorator) is cst.Call else decorator.decorator
            if dotted_name(target) in _DATACLASS_DECORATORS:
                return True
        return any((dotted_name(base.value) or "").endswith(_CONFIG_BASES) for base in cls.bases)

    def record_fields(self, cls: cst.ClassDef) -> list[tuple[str, cst.BaseExpression | None]]:
        """A dataclass's fields in order, with their default expressions."""
        fields: list[tuple[str, cst.BaseExpression | None]] = []
        for owner in reversed(self.lineage(cls)):
            body = owner.body.body if type(owner.body) is cst.IndentedBlock else ()
            for statement in body:
                if type(statement) is not cst.SimpleStatementLine:
                    continue
                for small in statement.body:
                    if type(small) is cst.AnnAssign and type(small.target) is cst.Name:
                        default = small.value
                        if type(default) is cst.Call and dotted_name(default.func) in ("field", "dataclasses.field"):
                            default = next((a.value for a in default.args if a.keyword and a.keyword.value == "default"), None)
                        fields = [item for item in fields if item[0] != small.target.value]
                        fields.append((small.target.value, default))
        return fields

    def dataclass_record(self, cls: cst.ClassDef, call: cst.Call | None, frame: Frame, *, parsed: bool = False) -> Record:
        fields = self.record_fields(cls)
        class_frame = self.frame_for(cls)
        values: dict[str, object] = {name: (default, class_frame) for name, default in fields if default is not None}
        defaults = set(values) if parsed else set()
        if call is not None:
            names = [name for name, _ in fields]
            position = 0
            for arg in call.args:
                if arg.star:
                    return Record({}, label="dataclass")
                if arg.keyword is not None:
                    values[arg.keyword.value] = (arg.value, frame)
                    defaults.discard(arg.keyword.value)
                elif position < len(names):
                    values[names[position]] = (arg.value, frame)
                    defaults.discard(names[position])
                    position += 1
        return Record(values, frozenset(defaults), label="dataclass")

    def parsed_dataclasses(self, parser: cst.BaseExpression, frame: Frame) -> Value | None:
        """`HfArgumentParser((ModelArgs, TrainArgs)).parse_args_into_dataclasses()`."""
        built = self.constructor_of(parser, frame)
        if built is None or not built.args:
            return None
        classes = self.evaluate(built.args[0].value, frame)
        if type(classes) is Definition:
            classes = Items((classes,))
        if type(classes) is not Items:
            return None
        records = []
        for item in classes.items:
            if type(item) is Definition and type(item.node) is cst.ClassDef:
                records.append(self.dataclass_record(item.node, None, frame, parsed=True))
            else:
                records.append(None)
        return Items(tuple(records))

    def constructor_of(self, expr: cst.BaseExpression, frame: Frame) -> cst.Call | None:
        """The call a name is bound to (`parser = HfArgumentParser(...)`)."""
        if type(expr) is cst.Call:
            return expr
        if type(expr) is not cst.Name:
            return None
        binding = self.index.reaching(expr.value, frame.scope, expr)
        if type(binding) is Binding and binding.kind is BindingKind.VALUE and type(binding.value) is cst.Call:
            return binding.value
        return None

    def library_config(self, call: cst.Call, class_name: str, frame: Frame, *, pretrained: bool = False) -> Value | None:
        checkpoint = None
        fields: dict[str, object] = {}
        args = list(call.args)
        if any(arg.star for arg in args):
            return None
        if pretrained:
            if not args or args[0].keyword is not None:
                return None
            name = self.evaluate(args[0].value, frame)
            if type(name) is not Known or not isinstance(name.value, str):
                return None
            checkpoint = name.value
            args = args[1:]
        for arg in args:
            if arg.keyword is not None:
                fields[arg.keyword.value] = (arg.value, frame)
        return LibraryConfig(class_name, fields, checkpoint)

    # --- argparse ---------------------------------------------------------------------
    def option_default(self, dest: str) -> Value | None:
        """The default of `--dest` (`set_defaults` wins), labelled as a default."""
        overrides = self.index.option_defaults.get(dest, [])
        if overrides:
            values = [self.evaluate(expr, self.frame_for(scope)) for expr, scope, _ in overrides]
            return _as_default(_agreed(values), f"{dest}={{}} (argparse default)")
        options = self.index.options.get(dest, [])
        values = []
        for option in options:
            if option.action in ("store_true", "store_false") and option.default is None:
                values.append(Known(option.action == "store_false"))
                continue
            if option.default is None:
                values.append(Known(None))
                continue
            value = self.evaluate(option.default, self.frame_for(option.scope))
            if type(value) is Known and isinstance(value.value, str) and option.type is not None:
                # argparse converts a string default through `type`.
                converter = dotted_name(option.type)
                try:
                    if converter == "int":
                        value = Known(int(value.value), value.evidence)
                    elif converter == "float":
                        value = Known(float(value.value), value.evidence)
                except ValueError:
                    value = None
            values.append(value)
        if not values:
            return None
        return _as_default(_agreed(values), f"{dest}={{}} (argparse default)")


# --- evidence helpers -------------------------------------------------------------------


def _merge(*parts: tuple[str, ...]) -> tuple[str, ...]:
    merged: list[str] = []
    for group in parts:
        for part in group:
            if part not in merged:
                merged.append(part)
    return tuple(merged)


def _evidence_of(values: object) -> tuple[str, ...]:
    return _merge(*[getattr(value, "evidence", ()) for value in values])  # type: ignore[union-attr]


def _is_default(value: object) -> bool:
    return bool(getattr(value, "default", False))


def _agreed(values: list[Value | None]) -> Value | None:
    known = [value for value in values if value is not None]
    if len(known) != len(values) or not known:
        return None
    first = known[0]
    if all(type(value) is Known and type(first) is Known and value.value == first.value for value in known):
        return first
    return None


def _show(value: object) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, str):
        return repr(value)
    return str(value)


def _labelled(value: Value | None, label: str | None) -> Value | None:
    """A named figure replaces the parts it was computed from, unless one of
    them is a default (whose own label says where it can be changed)."""
    if label is None or type(value) is not Known or value.default or isinstance(value.value, bool) or value.value is None:
        return value
    return Known(value.value, (f"{label}={_show(value.value)}",), False)


def _as_default(value: Value | None, template: str) -> Value | None:
    if type(value) is not Known or value.value is None:
        return value
    return Known(value.value, (template.format(_show(value.value)),), True)


def known_number(value: Value | None) -> Known | None:
    if type(value) is Known and isinstance(value.value, (int, float)) and not isinstance(value.value, bool):
        return value
    return None
