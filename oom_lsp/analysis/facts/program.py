"""The file as a program: its functions, classes, names and call sites.

One traversal of the libcst tree builds the index that the other facts read
(Ruff's semantic model, in the small): every function (methods, nested
functions and lambdas included) with the class and function that define it,
every class with its bases, methods and the `self.x` attributes its methods
assign, the bindings of each scope, and every call with what its own scope
says about it at that point:

- the grad mode the `with` blocks and `torch.set_grad_enabled(...)`
  statements around it impose (`LocalGrad`: OFF, ON, MAYBE when it depends on a
  value, or None when nothing inside the scope decides and the callers do);
- the loops (and comprehensions) of its scope that enclose it;
- whether an autocast region encloses it;
- its position in the scope's statement order, for "after `model.eval()`".

Functions are also recorded where they are used as values rather than called
(passed to another call, stored, returned, registered as a hook): such a
function has callers the file does not show, and the context facts treat them
as unknown unless a library summary says how the receiver calls it.

Nothing here interprets values; `contexts` resolves calls and merges what the
callers say, `values` evaluates expressions.
"""

from __future__ import annotations

import enum
import re
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import libcst as cst

from oom_lsp.analysis.context import FileContext, ImportMap, dotted_name
from oom_lsp.analysis.walker import child_fields, is_node


class LocalGrad(enum.Enum):
    """The grad mode a scope's own code imposes on a statement."""

    OFF = "off"  # torch.no_grad(), inference_mode(), set_grad_enabled(False), a project no-grad helper
    ON = "on"  # torch.enable_grad(), set_grad_enabled(True)
    MAYBE = "maybe"  # set_grad_enabled(flag), `no_grad() if x else nullcontext()`


class BindingKind(enum.Enum):
    ASSIGN = "assign"  # `name = value` (also annotated and walrus)
    AUGMENT = "augment"  # `name += value`
    PARAM = "param"
    DEF = "def"
    CLASS = "class"
    IMPORT = "import"
    LOOP = "loop"  # a `for` target or a comprehension's
    WITH = "with"  # `with ... as name`
    OTHER = "other"  # `except E as name`, `del`, a global statement


@dataclass(eq=False, slots=True, repr=False)
class Binding:
    name: str
    kind: BindingKind
    # The value bound by `name = value`; None for the other kinds.
    value: cst.BaseExpression | None
    # The statement (or parameter, def, class) that binds it.
    node: cst.CSTNode
    # The position of that statement in its scope's order.
    index: int
    # The scope whose code binds it (its value's names resolve from there).
    scope: Function | None = None


@dataclass(eq=False, slots=True, repr=False)
class Call:
    node: cst.Call
    scope: Function
    statement: cst.CSTNode
    index: int
    local_grad: LocalGrad | None
    autocast: bool
    # The loops of the scope around the call, outermost first (a comprehension
    # counts as the loop it is).
    loops: tuple[cst.CSTNode, ...]
    # The statements around the call, outermost first (the file's, across scopes).
    path: tuple[cst.CSTNode, ...] = ()


@dataclass(eq=False, slots=True, repr=False)
class Reference:
    """A function of the file used as a value, not called: where it goes."""

    function: Function
    node: cst.BaseExpression
    scope: Function
    # The call it is an argument of, and which argument (keyword or position).
    passed_to: cst.Call | None = None
    keyword: str | None = None
    position: int | None = None
    # Wrapped by a call whose result is what is passed on (`torch.no_grad()(fn)`).
    wrapped_by: cst.Call | None = None


@dataclass(eq=False, slots=True, repr=False)
class Klass:
    node: cst.ClassDef
    name: str
    qualname: str
    scope: Function
    bases: tuple[cst.BaseExpression, ...]
    methods: dict[str, list[Function]] = field(default_factory=dict)
    # `self.x = value` in any of its methods: x -> bindings (node: the statement).
    attributes: dict[str, list[Binding]] = field(default_factory=dict)
    # Names bound in the class body itself.
    class_names: dict[str, list[Binding]] = field(default_factory=dict)


@dataclass(eq=False, slots=True, repr=False)
class Function:
    """A scope that runs code: a function, a lambda, or the module's top level."""

    node: cst.FunctionDef | cst.Lambda | cst.Module
    name: str
    qualname: str
    owner: Klass | None  # the class whose body defines it (a method)
    parent: Function | None  # the scope whose code defines it (None: the module)
    params: tuple[str, ...] = ()
    decorators: tuple[cst.BaseExpression, ...] = ()
    calls: list[Call] = field(default_factory=list)
    bindings: dict[str, list[Binding]] = field(default_factory=dict)
    # Names declared `global` / `nonlocal`: bound in another scope.
    outer_names: set[str] = field(default_factory=set)
    # Nested functions and classes by name.
    functions: dict[str, list[Function]] = field(default_factory=dict)
    classes: dict[str, list[Klass]] = field(default_factory=dict)
    statements: int = 0

    @property
    def is_module(self) -> bool:
        return type(self.node) is cst.Module

    @property
    def is_lambda(self) -> bool:
        return type(self.node) is cst.Lambda

    @property
    def is_method(self) -> bool:
        return self.owner is not None

    @property
    def self_name(self) -> str | None:
        """The name of the instance in a method (`self`), None for static methods."""
        if self.owner is None or not self.params:
            return None
        for decorator in self.decorators:
            if dotted_name(decorator) in ("staticmethod", "classmethod"):
                return None
        return self.params[0]

    def __repr__(self) -> str:  # shown in test failures
        return f"<Function {self.qualname}>"


_GRAD_OFF = frozenset(
    {
        "torch.no_grad",
        "torch.inference_mode",
        "torch.autograd.no_grad",
        "torch.autograd.grad_mode.no_grad",
        "torch.autograd.grad_mode.inference_mode",
    }
)
_GRAD_ON = frozenset({"torch.enable_grad", "torch.autograd.enable_grad", "torch.autograd.grad_mode.enable_grad"})
_SET_GRAD = frozenset(
    {"torch.set_grad_enabled", "torch.autograd.set_grad_enabled", "torch.autograd.grad_mode.set_grad_enabled"}
)
_AUTOCAST = frozenset(
    {
        "torch.autocast",
        "torch.amp.autocast",
        "torch.cuda.amp.autocast",
        "torch.cpu.amp.autocast",
        "torch.amp.autocast_mode.autocast",
    }
)
# A context manager or decorator of the project named for turning autograd off
# (yolov5's `smart_inference_mode()`): it can only silence a finding.
_GRAD_OFF_WORDS = ("no_grad", "inference_mode")
_CONTEXT_MANAGER_DECORATORS = frozenset({"contextlib.contextmanager", "contextmanager"})
_NULL_CONTEXTS = frozenset({"contextlib.nullcontext", "nullcontext", "contextlib.suppress"})


def grad_effect(expr: cst.BaseExpression, imports: ImportMap, local_off: frozenset[str] = frozenset()) -> LocalGrad | None:
    """What a context manager or decorator expression does to the grad mode.

    `local_off`: functions of the file that turn autograd off for their
    caller (a `@contextmanager` yielding under `no_grad()`, a factory
    returning `torch.no_grad()`)."""
    if type(expr) is cst.IfExp:
        branches = {grad_effect(expr.body, imports, local_off), grad_effect(expr.orelse, imports, local_off)}
        if branches == {LocalGrad.OFF}:
            return LocalGrad.OFF
        if branches == {LocalGrad.ON}:
            return LocalGrad.ON
        return LocalGrad.MAYBE if branches - {None} else None
    target = expr.func if type(expr) is cst.Call else expr
    qualified = imports.qualified_name(target)
    if qualified in _GRAD_OFF:
        if type(expr) is cst.Call and expr.args:
            mode = expr.args[0].value
            if type(mode) is cst.Name and mode.value == "False":
                return None  # inference_mode(False)
            if type(mode) is not cst.Name or mode.value != "True":
                return LocalGrad.MAYBE
        return LocalGrad.OFF
    if qualified in _GRAD_ON:
        return LocalGrad.ON
    if qualified in _SET_GRAD:
        if type(expr) is not cst.Call or not expr.args:
            return None
        mode = expr.args[0].value
        if type(mode) is cst.Name and mode.value in ("True", "False"):
            return LocalGrad.ON if mode.value == "True" else LocalGrad.OFF
        return LocalGrad.MAYBE
    if qualified is not None and qualified.startswith("torch."):
        return None
    dotted = dotted_name(target)
    if dotted is None:
        return None
    if qualified is None and dotted in local_off:
        return LocalGrad.OFF
    last = dotted.rpartition(".")[2].lower()
    if any(word in last for word in _GRAD_OFF_WORDS):
        return LocalGrad.OFF
    return None


def is_autocast(expr: cst.BaseExpression, imports: ImportMap) -> bool:
    target = expr.func if type(expr) is cst.Call else expr
    return imports.qualified_name(target) in _AUTOCAST


def _grad_disabling_functions(module: cst.Module, imports: ImportMap) -> frozenset[str]:
    """Module-level functions that turn autograd off for their caller: a
    `@contextmanager` that yields under `torch.no_grad()`, or a factory that
    returns `torch.no_grad()` / `torch.inference_mode()`."""
    found = set()
    for statement in module.body:
        if type(statement) is not cst.FunctionDef:
            continue
        if any(dotted_name(d.decorator) in _CONTEXT_MANAGER_DECORATORS for d in statement.decorators):
            if _yields_under(statement.body, imports):
                found.add(statement.name.value)
        elif _returns_grad_off(statement.body, imports):
            found.add(statement.name.value)
    return frozenset(found)


def _yields_under(node: cst.CSTNode, imports: ImportMap) -> bool:
    for child in node.children:
        if type(child) in (cst.FunctionDef, cst.ClassDef, cst.Lambda):
            continue
        if type(child) is cst.With and any(grad_effect(i.item, imports) is LocalGrad.OFF for i in child.items):
            if any(type(inner) is cst.Yield for inner in _descendants(child.body)):
                return True
        elif _yields_under(child, imports):
            return True
    return False


def _returns_grad_off(body: cst.BaseSuite, imports: ImportMap) -> bool:
    if type(body) is not cst.IndentedBlock:
        return False
    for statement in body.body:
        if type(statement) is cst.SimpleStatementLine:
            for small in statement.body:
                if (
                    type(small) is cst.Return
                    and small.value is not None
                    and grad_effect(small.value, imports) is LocalGrad.OFF
                ):
                    return True
    return False


def _descendants(node: cst.CSTNode) -> Iterator[cst.CSTNode]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        for field_name in child_fields(type(current)):
            value = getattr(current, field_name)
            if type(value) is tuple or type(value) is list:
                stack.extend(child for child in value if is_node(child))
            elif is_node(value):
                stack.append(value)


_FUNCTION_NAME_RE = re.compile(r"\bdef\s+([A-Za-z_]\w*)|\b([A-Za-z_]\w*)\s*=\s*lambda\b")
_COMPREHENSIONS = frozenset({cst.ListComp, cst.SetComp, cst.DictComp, cst.GeneratorExp})
_SEQUENCES = frozenset({cst.Tuple, cst.List})


class Program:
    """The index of one file. Build it with `program_of(context)`."""

    def __init__(self, context: FileContext) -> None:
        self.imports = context.imports
        self.module_node = context.module
        self.module = Function(node=context.module, name="<module>", qualname="<module>", owner=None, parent=None)
        self.functions: list[Function] = [self.module]
        self.classes: list[Klass] = []
        self.references: list[Reference] = []
        # id(node) -> its Function / Klass / Call.
        self.function_of_node: dict[int, Function] = {}
        self.class_of_node: dict[int, Klass] = {}
        self.call_of_node: dict[int, Call] = {}
        self.local_grad_off = _grad_disabling_functions(context.module, context.imports)
        _Builder(self, context.source).build(context.module)

    # --- lookups ------------------------------------------------------------
    def function(self, node: cst.CSTNode) -> Function | None:
        return self.function_of_node.get(id(node))

    def klass(self, node: cst.CSTNode) -> Klass | None:
        return self.class_of_node.get(id(node))

    def call(self, node: cst.Call) -> Call | None:
        return self.call_of_node.get(id(node))

    def lookup(self, name: str, scope: Function) -> list[Binding]:
        """The bindings `name` may refer to from `scope` (Python's LEGB rule,
        flow-insensitive: every binding of the nearest scope that binds it).
        Class bodies are skipped, as Python does for the functions in them."""
        current: Function | None = scope
        while current is not None:
            if name in current.bindings and name not in current.outer_names:
                return current.bindings[name]
            current = current.parent
        return []

    def methods_named(self, name: str) -> list[Function]:
        return [method for klass in self.classes for method in klass.methods.get(name, ())]


class _Builder:
    """One recursive traversal that fills a Program."""

    def __init__(self, program: Program, source: str) -> None:
        self.program = program
        self.imports = program.imports
        # Names a `def` or a lambda assignment binds somewhere in the file: only
        # these can name a function used as a value.
        self.function_names = frozenset(a or b for a, b in _FUNCTION_NAME_RE.findall(source))
        self.scope = program.module
        self.klass: Klass | None = None  # the class whose body is being read
        self.statement: cst.CSTNode | None = None
        self.path: list[cst.CSTNode] = []
        self.grad: list[LocalGrad] = []
        self.autocast = 0
        self.loops: list[cst.CSTNode] = []
        # Per scope: the grad mode a `set_grad_enabled(...)` statement switched to.
        self.switched: LocalGrad | None = None

    def build(self, module: cst.Module) -> None:
        self.program.function_of_node[id(module)] = self.program.module
        self._block(module.body)

    # --- scopes ---------------------------------------------------------------
    def _enter_function(self, node: cst.FunctionDef | cst.Lambda) -> Function:
        owner = self.klass
        parent = self.scope
        if type(node) is cst.FunctionDef:
            name = node.name.value
            decorators = tuple(d.decorator for d in node.decorators)
        else:
            name = "<lambda>"
            decorators = ()
        prefix = owner.qualname if owner is not None else ("" if parent.is_module else parent.qualname + ".<locals>")
        qualname = f"{prefix}.{name}" if prefix else name
        params = node.params
        names = tuple(
            param.name.value
            for param in (*params.posonly_params, *params.params)
        )
        star = tuple(
            star.name.value for star in (params.star_arg, params.star_kwarg) if isinstance(star, cst.Param)
        )
        kwonly = tuple(param.name.value for param in params.kwonly_params)
        function = Function(
            node=node,
            name=name,
            qualname=qualname,
            owner=owner,
            parent=parent,
            params=names + kwonly + star,
            decorators=decorators,
        )
        self.program.functions.append(function)
        self.program.function_of_node[id(node)] = function
        for index, param in enumerate(function.params):
            function.bindings.setdefault(param, []).append(Binding(param, BindingKind.PARAM, None, node, -1, function))
        if type(node) is cst.FunctionDef:
            if owner is not None:
                owner.methods.setdefault(name, []).append(function)
            else:
                parent.functions.setdefault(name, []).append(function)
        return function

    def _function(self, node: cst.FunctionDef | cst.Lambda) -> None:
        if type(node) is cst.FunctionDef:
            for decorator in node.decorators:
                self._expression(decorator.decorator)
            self._bind(node.name.value, BindingKind.DEF, None, node)
            self._parameters_defaults(node.params)
        else:
            self._parameters_defaults(node.params)
        function = self._enter_function(node)
        saved = (self.scope, self.klass, self.grad, self.autocast, self.loops, self.switched, self.statement)
        self.scope, self.klass, self.grad, self.autocast, self.loops, self.switched = function, None, [], 0, [], None
        if type(node) is cst.FunctionDef:
            body = node.body
            if type(body) is cst.IndentedBlock:
                self._block(body.body)
            else:
                self._block(body.body)  # `def f(): return x` on one line
        else:
            self._expression(node.body)
        self.scope, self.klass, self.grad, self.autocast, self.loops, self.switched, self.statement = saved

    def _parameters_defaults(self, params: cst.Parameters) -> None:
        for param in (*params.posonly_params, *params.params, *params.kwonly_params):
            if param.default is not None:
                self._expression(param.default)

    def _class(self, node: cst.ClassDef) -> None:
        for decorator in node.decorators:
            self._expression(decorator.decorator)
        for base in node.bases:
            self._expression(base.value)
        self._bind(node.name.value, BindingKind.CLASS, None, node)
        outer = self.klass.qualname if self.klass is not None else ("" if self.scope.is_module else self.scope.qualname + ".<locals>")
        klass = Klass(
            node=node,
            name=node.name.value,
            qualname=f"{outer}.{node.name.value}" if outer else node.name.value,
            scope=self.scope,
            bases=tuple(arg.value for arg in node.bases if arg.keyword is None),
        )
        self.program.classes.append(klass)
        self.program.class_of_node[id(node)] = klass
        self.scope.classes.setdefault(klass.name, []).append(klass)
        saved = self.klass
        self.klass = klass
        if type(node.body) is cst.IndentedBlock:
            self._block(node.body.body)
        else:
            self._block(node.body.body)
        self.klass = saved

    # --- bindings --------------------------------------------------------------
    def _named_grad_effect(self, name: str) -> LocalGrad | None:
        """`with ctx:` where this scope bound `ctx = torch.no_grad() if
        evaluating else nullcontext()` before: the effect of what it may hold."""
        effects = {
            grad_effect(binding.value, self.imports, self.program.local_grad_off)
            for binding in self.scope.bindings.get(name, ())
            if binding.kind is BindingKind.ASSIGN and binding.value is not None
        }
        if not effects - {None}:
            return None
        return effects.pop() if len(effects) == 1 else LocalGrad.MAYBE

    def _bind(self, name: str, kind: BindingKind, value: cst.BaseExpression | None, node: cst.CSTNode) -> None:
        binding = Binding(name, kind, value, node, self.scope.statements, self.scope)
        if self.klass is not None:
            self.klass.class_names.setdefault(name, []).append(binding)
            return
        self.scope.bindings.setdefault(name, []).append(binding)

    def _bind_target(self, target: cst.BaseExpression, kind: BindingKind, value: cst.BaseExpression | None, node: cst.CSTNode) -> None:
        target_type = type(target)
        if target_type is cst.Name:
            self._bind(target.value, kind, value, node)
        elif target_type in _SEQUENCES:
            values = _unpacked(target, value) if kind is BindingKind.ASSIGN else None
            for index, element in enumerate(target.elements):
                inner = element.value
                if values is not None:
                    # `a, b = [], []`: the same bindings as `a = []` and `b = []`.
                    self._bind_target(inner, kind, values[index], node)
                else:
                    self._bind_target(inner, kind if kind is not BindingKind.ASSIGN else BindingKind.OTHER, None, node)
        elif target_type is cst.StarredElement:
            self._bind_target(target.value, BindingKind.OTHER, None, node)
        elif target_type is cst.Attribute:
            self._expression(target.value)
            self._bind_attribute(target, kind, value, node)
        elif target_type is cst.Subscript:
            self._expression(target)

    def _bind_attribute(
        self, target: cst.Attribute, kind: BindingKind, value: cst.BaseExpression | None, node: cst.CSTNode
    ) -> None:
        """`self.x = value` in a method records an attribute of its class."""
        scope = self.scope
        owner = scope.owner
        self_name = scope.self_name
        if owner is None or self_name is None:
            return
        if type(target.value) is cst.Name and target.value.value == self_name:
            owner.attributes.setdefault(target.attr.value, []).append(
                Binding(target.attr.value, kind, value, node, scope.statements, scope)
            )

    # --- statements --------------------------------------------------------
    def _block(self, body: Sequence[cst.CSTNode]) -> None:
        switched = self.switched
        for statement in body:
            self._statement(statement)
        self.switched = switched  # a switch inside a block lasts until the block ends (approximation)

    def _statement(self, statement: cst.CSTNode) -> None:
        self.scope.statements += 1
        statement_type = type(statement)
        previous = self.statement
        self.statement = statement
        self.path.append(statement)
        if statement_type is cst.SimpleStatementLine or statement_type is cst.SimpleStatementSuite:
            for small in statement.body:
                self._small(small, statement)
            self._grad_switch(statement)
        elif statement_type is cst.FunctionDef:
            self._function(statement)
        elif statement_type is cst.ClassDef:
            self._class(statement)
        elif statement_type is cst.If:
            self._expression(statement.test)
            self._suite(statement.body)
            if statement.orelse is not None:
                if type(statement.orelse) is cst.If:
                    self._statement(statement.orelse)
                else:
                    self._suite(statement.orelse.body)
        elif statement_type is cst.For:
            self._expression(statement.iter)
            self.loops.append(statement)
            self._bind_target(statement.target, BindingKind.LOOP, None, statement)
            self._suite(statement.body)
            self.loops.pop()
            if statement.orelse is not None:
                self._suite(statement.orelse.body)
        elif statement_type is cst.While:
            self.loops.append(statement)
            self._expression(statement.test)
            self._suite(statement.body)
            self.loops.pop()
            if statement.orelse is not None:
                self._suite(statement.orelse.body)
        elif statement_type is cst.With:
            effect: LocalGrad | None = None
            autocast = False
            for item in statement.items:
                self._expression(item.item)
                item_effect = grad_effect(item.item, self.imports, self.program.local_grad_off)
                if item_effect is None and type(item.item) is cst.Name:
                    item_effect = self._named_grad_effect(item.item.value)
                if item_effect is not None:
                    effect = item_effect
                if is_autocast(item.item, self.imports):
                    autocast = True
                if item.asname is not None:
                    self._bind_target(item.asname.name, BindingKind.WITH, None, statement)
            if effect is not None:
                self.grad.append(effect)
            self.autocast += autocast
            self._suite(statement.body)
            self.autocast -= autocast
            if effect is not None:
                self.grad.pop()
        elif statement_type is cst.Try or statement_type is cst.TryStar:
            self._suite(statement.body)
            for handler in statement.handlers:
                if handler.type is not None:
                    self._expression(handler.type)
                if handler.name is not None and type(handler.name.name) is cst.Name:
                    self._bind(handler.name.name.value, BindingKind.OTHER, None, handler)
                self._suite(handler.body)
            if statement.orelse is not None:
                self._suite(statement.orelse.body)
            if statement.finalbody is not None:
                self._suite(statement.finalbody.body)
        elif statement_type is cst.Match:
            self._expression(statement.subject)
            for case in statement.cases:
                self._suite(case.body)
        self.statement = previous
        self.path.pop()

    def _suite(self, suite: cst.BaseSuite) -> None:
        self._block(suite.body)

    def _grad_switch(self, statement: cst.CSTNode) -> None:
        """`torch.set_grad_enabled(False)` or `stack.enter_context(torch.no_grad())`
        as a statement: the grad mode of the statements after it."""
        if len(statement.body) != 1:
            return
        small = statement.body[0]
        if type(small) is not cst.Expr or type(small.value) is not cst.Call:
            return
        call = small.value
        if len(call.args) != 1:
            return
        func = call.func
        if type(func) is cst.Attribute and func.attr.value == "enter_context":
            effect = grad_effect(call.args[0].value, self.imports, self.program.local_grad_off)
            if effect is not None:
                self.switched = effect
            return
        if self.imports.qualified_name(func) in _SET_GRAD:
            effect = grad_effect(call, self.imports)
            if effect is not None:
                self.switched = effect

    def _small(self, small: cst.BaseSmallStatement, statement: cst.CSTNode) -> None:
        small_type = type(small)
        if small_type is cst.Assign:
            self._expression(small.value)
            for target in small.targets:
                self._bind_target(target.target, BindingKind.ASSIGN, small.value, statement)
        elif small_type is cst.AnnAssign:
            if small.value is not None:
                self._expression(small.value)
                self._bind_target(small.target, BindingKind.ASSIGN, small.value, statement)
        elif small_type is cst.AugAssign:
            self._expression(small.value)
            self._expression(small.target)
            self._bind_target(small.target, BindingKind.AUGMENT, None, statement)
        elif small_type is cst.Import or small_type is cst.ImportFrom:
            if type(small.names) is not cst.ImportStar:
                for alias in small.names:
                    bound = alias.asname.name if alias.asname is not None else alias.name
                    name = dotted_name(bound) if type(bound) in (cst.Name, cst.Attribute) else None
                    if name is not None:
                        self._bind(name.split(".")[0], BindingKind.IMPORT, None, statement)
                    if not self.scope.is_module:
                        self.imports.add_import(small)
        elif small_type is cst.Global or small_type is cst.Nonlocal:
            for item in small.names:
                self.scope.outer_names.add(item.name.value)
        elif small_type is cst.Del:
            self._expression(small.target)
        else:
            for field_name in child_fields(small_type):
                value = getattr(small, field_name)
                if is_node(value) and isinstance(value, cst.BaseExpression):
                    self._expression(value)

    # --- expressions -------------------------------------------------------
    def _expression(self, expr: cst.CSTNode) -> None:
        expr_type = type(expr)
        if expr_type is cst.Call:
            self._call(expr)
            return
        if expr_type is cst.Lambda:
            self._function(expr)
            return
        if expr_type in _COMPREHENSIONS:
            self._comprehension(expr)
            return
        if expr_type is cst.NamedExpr:
            self._expression(expr.value)
            self._bind_target(expr.target, BindingKind.ASSIGN, expr.value, self.statement or expr)
            return
        if expr_type is cst.Name:
            self._reference(expr, None, None, None)
            return
        if expr_type is cst.Attribute:
            if self._reference(expr, None, None, None):
                return
            self._expression(expr.value)
            return
        for field_name in child_fields(expr_type):
            value = getattr(expr, field_name)
            if value is None:
                continue
            if type(value) is tuple or type(value) is list:
                for child in value:
                    if is_node(child):
                        self._expression(child)
            elif is_node(value):
                self._expression(value)

    def _comprehension(self, expr: cst.CSTNode) -> None:
        self.loops.append(expr)
        comp_for = expr.for_in
        first = True
        while comp_for is not None:
            if first:
                self._expression(comp_for.iter)  # evaluated in the enclosing scope
                first = False
            else:
                self._expression(comp_for.iter)
            self._bind_target(comp_for.target, BindingKind.LOOP, None, self.statement or expr)
            for condition in comp_for.ifs:
                self._expression(condition.test)
            comp_for = comp_for.inner_for_in
        if type(expr) is cst.DictComp:
            self._expression(expr.key)
            self._expression(expr.value)
        else:
            self._expression(expr.elt)
        self.loops.pop()

    def _current_grad(self) -> LocalGrad | None:
        if self.grad:
            return self.grad[-1]
        return self.switched

    def _call(self, node: cst.Call) -> None:
        statement = self.statement if self.statement is not None else node
        call = Call(
            node=node,
            scope=self.scope,
            statement=statement,
            index=self.scope.statements,
            local_grad=self._current_grad(),
            autocast=self.autocast > 0,
            loops=tuple(self.loops),
            path=tuple(self.path),
        )
        self.scope.calls.append(call)
        self.program.call_of_node[id(node)] = call
        func = node.func
        if type(func) is cst.Attribute:
            self._expression(func.value)
        elif type(func) is not cst.Name:
            self._expression(func)
        for position, arg in enumerate(node.args):
            value = arg.value
            keyword = arg.keyword.value if arg.keyword is not None else None
            if type(value) in (cst.Name, cst.Attribute) and self._reference(
                value, node, keyword, None if keyword is not None or arg.star else position
            ):
                continue
            self._expression(value)

    def _reference(
        self, expr: cst.BaseExpression, call: cst.Call | None, keyword: str | None, position: int | None
    ) -> bool:
        """A name or `self.method` used as a value, not called: kept when it
        may name a function of the file (resolved once the whole file is
        indexed). True when `expr` needs no further traversal."""
        if type(expr) is cst.Name:
            if expr.value in self.function_names:
                self.program.references.append(
                    Reference(None, expr, self.scope, call, keyword, position)  # type: ignore[arg-type]
                )
            return True
        if type(expr) is cst.Attribute and expr.attr.value in self.function_names:
            self.program.references.append(
                Reference(None, expr, self.scope, call, keyword, position)  # type: ignore[arg-type]
            )
        return False


def _unpacked(target: cst.BaseExpression, value: cst.BaseExpression | None) -> list[cst.BaseExpression] | None:
    """The value each element of a tuple target takes from a tuple or list
    display of the same length (`a, b = x, y`); None for anything else (a
    call's result, a starred element on either side)."""
    if type(value) not in _SEQUENCES or len(value.elements) != len(target.elements):  # type: ignore[union-attr]
        return None
    if any(type(element) is cst.StarredElement for element in (*target.elements, *value.elements)):  # type: ignore[union-attr]
        return None
    return [element.value for element in value.elements]  # type: ignore[union-attr]


_PROGRAMS: weakref.WeakKeyDictionary[FileContext, Program] = weakref.WeakKeyDictionary()


def program_of(context: FileContext) -> Program:
    """The file's Program, built once per analysis."""
    program = _PROGRAMS.get(context)
    if program is None:
        program = _PROGRAMS[context] = Program(context)
    return program


def iter_scopes(program: Program) -> Iterator[Function]:
    return iter(program.functions)
