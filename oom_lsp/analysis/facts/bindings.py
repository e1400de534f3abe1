"""Where the file binds its names, and which binding reaches a use.

One walk over the file's statements (not its expressions: about a fifth of
the nodes) records, per scope (a function, a class body, or the module):

- every binding of a name or of a dotted path (`x = ...`, `self.dim = ...`,
  `cfg.model.dim = ...`, `config["hidden"] = ...`), augmented assignments,
  loop and `with` targets, imports, `def` and `class`;
- the expression statements that grow a container (`layers.append(...)`,
  `self.add_module(...)`) and the argparse options (`add_argument`,
  `set_defaults`) with their defaults;
- the parent of each statement and its order in the file.

`reaching(name, scope, use)` then answers which single binding gives `name`
its value at `use`: the only binding of the scope, or the last one before the
use when it dominates the use in straight-line code and no binding inside an
enclosing loop can come round the back edge (pyright's code-flow idea, cut
down to what a size needs). Anything else is ambiguous, and sizes stay
unknown. Walrus targets and `match` captures are not recorded (rare in
training code; a name they bind may then look constant when it is not).
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.walker import child_fields, is_node

Scope = cst.FunctionDef | cst.ClassDef | None


class BindingKind(enum.Enum):
    VALUE = "value"  # `x = expr`: `value` is expr
    AUGMENTED = "augmented"  # `x += expr`: `value` is expr, `operator` the operation
    UNPACKED = "unpacked"  # `a, b = expr` (not a literal): `value` is expr, `index` the position
    FUNCTION = "function"  # `def x`
    CLASS = "class"  # `class x`
    OTHER = "other"  # a loop or `with` target, an import, `del`, `except ... as x`


@dataclass(frozen=True, eq=False)
class Binding:
    name: str
    statement: cst.CSTNode
    order: int
    kind: BindingKind
    value: cst.BaseExpression | None = None
    operator: cst.BaseAugOp | None = None
    index: int = 0
    definition: cst.FunctionDef | cst.ClassDef | None = None


@dataclass(frozen=True, eq=False)
class MethodCall:
    """An expression statement `receiver.method(...)` (`layers.append(block)`)."""

    receiver: str
    method: str
    call: cst.Call
    statement: cst.CSTNode


@dataclass(frozen=True, eq=False)
class Option:
    """One `parser.add_argument(...)` of the file."""

    dest: str
    default: cst.BaseExpression | None
    type: cst.BaseExpression | None
    action: str | None
    scope: Scope
    statement: cst.CSTNode


class Ambiguous(enum.Enum):
    """No single binding reaches the use (several paths, a loop, no position)."""

    AMBIGUOUS = "ambiguous"


AMBIGUOUS = Ambiguous.AMBIGUOUS


@dataclass
class _ScopeTable:
    names: dict[str, list[Binding]] = field(default_factory=dict)
    method_calls: dict[str, list[MethodCall]] = field(default_factory=dict)
    global_names: set[str] = field(default_factory=set)


_ARGPARSE_METHODS = frozenset({"add_argument", "set_defaults"})
_CONTAINER_METHODS = frozenset({"append", "extend", "insert", "add_module", "register_parameter", "update"})
_FIELDS: dict[type, tuple[str, ...]] = {}
_LOOPS = frozenset({cst.For, cst.While})
_DEFINITIONS = frozenset({cst.FunctionDef, cst.ClassDef})


class FileIndex:
    """The statement-level index of one file (see the module docstring)."""

    def __init__(self, module: cst.Module) -> None:
        self.module = module
        self.parent: dict[cst.CSTNode, cst.CSTNode] = {}
        self.order: dict[cst.CSTNode, int] = {}
        self.scope_of: dict[cst.CSTNode, Scope] = {}
        # Each scope's own statements, in order (not those of nested functions and classes).
        self.statements: dict[Scope, list[cst.CSTNode]] = {}
        self.tables: dict[Scope, _ScopeTable] = {None: _ScopeTable()}
        self.classes: dict[str, cst.ClassDef] = {}
        self.functions: dict[str, cst.FunctionDef] = {}
        self.class_of_method: dict[cst.FunctionDef, cst.ClassDef] = {}
        self.methods: dict[cst.ClassDef, dict[str, cst.FunctionDef]] = {}
        # `self.<attr>` bindings of each class, in any of its methods.
        self.self_bindings: dict[cst.ClassDef, dict[str, list[Binding]]] = {}
        self.options: dict[str, list[Option]] = {}
        self.option_defaults: dict[str, list[tuple[cst.BaseExpression, Scope, cst.CSTNode]]] = {}
        self._expression_statements: dict[Scope, dict[cst.CSTNode, cst.CSTNode]] = {}
        self._counter = 0
        self._walk_block(module.body, module, None)

    # --- queries -------------------------------------------------------------
    def table(self, scope: Scope) -> _ScopeTable:
        return self.tables.get(scope) or _ScopeTable()

    def bindings_of(self, name: str, scope: Scope) -> list[Binding]:
        return self.table(scope).names.get(name, [])

    def method_calls_on(self, receiver: str, scope: Scope) -> list[MethodCall]:
        return self.table(scope).method_calls.get(receiver, [])

    def ancestors(self, node: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """The statements and blocks above a statement, innermost first, to the module."""
        current = self.parent.get(node)
        while current is not None:
            yield current
            current = self.parent.get(current)

    def enclosing_scope(self, definition: cst.FunctionDef | cst.ClassDef) -> Scope:
        return self.scope_of.get(definition)

    def enclosing_loops(self, statement: cst.CSTNode, scope: Scope) -> list[cst.For | cst.While]:
        """The loops of `scope` whose body holds `statement`, innermost first."""
        loops = []
        for ancestor in self.ancestors(statement):
            if ancestor is scope or type(ancestor) in _DEFINITIONS:
                break
            if type(ancestor) in _LOOPS:
                loops.append(ancestor)
        return loops

    def statement_of(self, expr: cst.CSTNode, scope: Scope) -> cst.CSTNode | None:
        """The statement of `scope` that holds `expr` (a statement itself for
        compound headers: the `for` of its target and iterable). Built on first
        use per scope: the one walk here that reads expressions."""
        if expr in self.order:
            return expr
        table = self._expression_statements.get(scope)
        if table is None:
            table = self._expression_statements[scope] = self._map_expressions(scope)
        return table.get(expr)

    def reaching(
        self, name: str, scope: Scope, use: cst.CSTNode | None, *, parameter: bool = False
    ) -> Binding | Ambiguous | None:
        """The binding of `name` in `scope` that gives it its value at `use`.

        None when no binding of the scope reaches the use (the caller then
        reads the parameter, when `name` is one, or the enclosing scope);
        AMBIGUOUS when more than one may. `use` None asks from outside the
        scope: a module-level name read from a function, after the import.
        """
        candidates = self.bindings_of(name, scope)
        if not candidates:
            return None
        if len(candidates) == 1 and not parameter:
            return candidates[0]
        if use is None:
            if scope is None and all(type(self.parent.get(b.statement)) is cst.Module for b in candidates):
                return candidates[-1]
            return AMBIGUOUS
        statement = self.statement_of(use, scope)
        if statement is None:
            return AMBIGUOUS
        position = self.order[statement]
        before = [b for b in candidates if b.order < position and b.statement is not statement]
        loops = self.enclosing_loops(statement, scope)
        if not before:
            # Read before any binding of the scope (a parameter's value), unless
            # a binding inside an enclosing loop comes round the back edge.
            if any(self._inside(b.statement, loop) for loop in loops for b in candidates):
                return AMBIGUOUS
            return None
        last = before[-1]
        above = set(self.ancestors(statement))
        if self.parent.get(last.statement) not in above and last.statement not in above:
            return AMBIGUOUS  # bound in a branch the use is not in
        for loop in loops:
            if last.statement is loop or self._inside(last.statement, loop):
                continue
            if any(self._inside(b.statement, loop) for b in candidates):
                return AMBIGUOUS
        return last

    def _inside(self, statement: cst.CSTNode, ancestor: cst.CSTNode) -> bool:
        return any(node is ancestor for node in self.ancestors(statement))

    # --- the walk ---------------------------------------------------------------
    def _note(self, statement: cst.CSTNode, parent: cst.CSTNode, scope: Scope) -> None:
        self.parent[statement] = parent
        self.order[statement] = self._counter
        self.scope_of[statement] = scope
        self.statements.setdefault(scope, []).append(statement)
        self._counter += 1

    def _bind(self, scope: Scope, name: str, statement: cst.CSTNode, kind: BindingKind, **extra: object) -> None:
        table = self.tables[scope]
        if scope is not None and name in table.global_names:
            table = self.tables[None]
        binding = Binding(name=name, statement=statement, order=self.order[statement], kind=kind, **extra)
        table.names.setdefault(name, []).append(binding)
        if type(scope) is cst.FunctionDef and name.startswith("self."):
            owner = self.class_of_method.get(scope)
            if owner is not None:
                attribute = name[len("self.") :]
                self.self_bindings.setdefault(owner, {}).setdefault(attribute, []).append(binding)

    def _walk_block(self, body: Sequence[cst.CSTNode], parent: cst.CSTNode, scope: Scope) -> None:
        for statement in body:
            self._walk_statement(statement, parent, scope)

    def _walk_suite(self, suite: cst.BaseSuite, owner: cst.CSTNode, scope: Scope) -> None:
        self.parent[suite] = owner
        if type(suite) is cst.IndentedBlock:
            self._walk_block(suite.body, suite, scope)
        else:  # SimpleStatementSuite: `if x: a = 1`
            self._walk_small(suite.body, owner, scope)

    def _walk_statement(self, statement: cst.CSTNode, parent: cst.CSTNode, scope: Scope) -> None:
        self._note(statement, parent, scope)
        kind = type(statement)
        if kind is cst.SimpleStatementLine:
            self._walk_small(statement.body, statement, scope)
        elif kind is cst.FunctionDef:
            self._bind(scope, statement.name.value, statement, BindingKind.FUNCTION, definition=statement)
            if scope is None:
                self.functions[statement.name.value] = statement
            elif type(scope) is cst.ClassDef:
                self.class_of_method[statement] = scope
                self.methods.setdefault(scope, {})[statement.name.value] = statement
            self.tables[statement] = _ScopeTable()
            self._walk_suite(statement.body, statement, statement)
        elif kind is cst.ClassDef:
            self._bind(scope, statement.name.value, statement, BindingKind.CLASS, definition=statement)
            if scope is None:
                self.classes[statement.name.value] = statement
            self.tables[statement] = _ScopeTable()
            self.methods.setdefault(statement, {})
            self._walk_suite(statement.body, statement, statement)
        elif kind is cst.For:
            for name in _target_names(statement.target):
                self._bind(scope, name, statement, BindingKind.OTHER)
            self._walk_suite(statement.body, statement, scope)
            if statement.orelse is not None:
                self._walk_clause(statement.orelse, statement, scope)
        elif kind is cst.While:
            self._walk_suite(statement.body, statement, scope)
            if statement.orelse is not None:
                self._walk_clause(statement.orelse, statement, scope)
        elif kind is cst.If:
            self._walk_suite(statement.body, statement, scope)
            orelse = statement.orelse
            if type(orelse) is cst.If:
                self._walk_statement(orelse, statement, scope)
            elif orelse is not None:
                self._walk_clause(orelse, statement, scope)
        elif kind is cst.With:
            for item in statement.items:
                if item.asname is not None:
                    for name in _target_names(item.asname.name):
                        self._bind(scope, name, statement, BindingKind.OTHER)
            self._walk_suite(statement.body, statement, scope)
        elif kind in (cst.Try, cst.TryStar):
            self._walk_suite(statement.body, statement, scope)
            for handler in statement.handlers:
                self._note(handler, statement, scope)
                if handler.name is not None:
                    for name in _target_names(handler.name.name):
                        self._bind(scope, name, handler, BindingKind.OTHER)
                self._walk_suite(handler.body, handler, scope)
            for clause in (statement.orelse, statement.finalbody):
                if clause is not None:
                    self._walk_clause(clause, statement, scope)
        elif kind is cst.Match:
            for case in statement.cases:
                self._note(case, statement, scope)
                self._walk_suite(case.body, case, scope)

    def _walk_clause(self, clause: cst.CSTNode, owner: cst.CSTNode, scope: Scope) -> None:
        """An `else:` / `finally:` clause: a block of its own under the owner."""
        self._note(clause, owner, scope)
        self._walk_suite(clause.body, clause, scope)

    def _walk_small(self, body: Sequence[cst.BaseSmallStatement], statement: cst.CSTNode, scope: Scope) -> None:
        """The small statements of a line, or of a one-line suite (`if x: a = 1`),
        which then share their owner's place."""
        for small in body:
            kind = type(small)
            if kind is cst.Assign:
                for target in small.targets:
                    self._bind_target(target.target, small.value, statement, scope)
            elif kind is cst.AnnAssign:
                if small.value is not None:
                    self._bind_target(small.target, small.value, statement, scope)
            elif kind is cst.AugAssign:
                name = _target_key(small.target)
                if name is not None:
                    self._bind(
                        scope, name, statement, BindingKind.AUGMENTED, value=small.value, operator=small.operator
                    )
            elif kind is cst.Global or kind is cst.Nonlocal:
                if kind is cst.Global:
                    self.tables[scope].global_names.update(item.name.value for item in small.names)
            elif kind is cst.Import or kind is cst.ImportFrom:
                for name in _imported_names(small):
                    self._bind(scope, name, statement, BindingKind.OTHER)
            elif kind is cst.Del:
                for name in _target_names(small.target):
                    self._bind(scope, name, statement, BindingKind.OTHER)
            elif kind is cst.Expr and type(small.value) is cst.Call:
                self._note_call(small.value, statement, scope)

    def _bind_target(
        self, target: cst.BaseExpression, value: cst.BaseExpression, statement: cst.CSTNode, scope: Scope
    ) -> None:
        if type(target) in (cst.Tuple, cst.List):
            elements = target.elements
            literal = value if type(value) in (cst.Tuple, cst.List) else None
            starred = any(type(element) is cst.StarredElement for element in elements)
            for index, element in enumerate(elements):
                if type(element) is cst.StarredElement:
                    for name in _target_names(element.value):
                        self._bind(scope, name, statement, BindingKind.OTHER)
                    continue
                if literal is not None and not starred and len(literal.elements) == len(elements):
                    item = literal.elements[index]
                    if type(item) is not cst.StarredElement:
                        self._bind_target(element.value, item.value, statement, scope)
                        continue
                key = _target_key(element.value)
                if key is not None:
                    self._bind(scope, key, statement, BindingKind.UNPACKED, value=value, index=index)
                else:
                    for name in _target_names(element.value):
                        self._bind(scope, name, statement, BindingKind.OTHER)
            return
        key = _target_key(target)
        if key is not None:
            self._bind(scope, key, statement, BindingKind.VALUE, value=value)

    def _note_call(self, call: cst.Call, statement: cst.CSTNode, scope: Scope) -> None:
        func = call.func
        if type(func) is not cst.Attribute:
            return
        method = func.attr.value
        if method in _ARGPARSE_METHODS:
            self._note_option(method, call, statement, scope)
            return
        if method in _CONTAINER_METHODS:
            receiver = _target_key(func.value)
            if receiver is not None:
                record = MethodCall(receiver=receiver, method=method, call=call, statement=statement)
                self.tables[scope].method_calls.setdefault(receiver, []).append(record)

    def _note_option(self, method: str, call: cst.Call, statement: cst.CSTNode, scope: Scope) -> None:
        if method == "set_defaults":
            for arg in call.args:
                if arg.keyword is not None:
                    self.option_defaults.setdefault(arg.keyword.value, []).append((arg.value, scope, statement))
            return
        flags = [_string(arg.value) for arg in call.args if arg.keyword is None]
        keywords = {arg.keyword.value: arg.value for arg in call.args if arg.keyword is not None}
        dest = _string(keywords["dest"]) if "dest" in keywords else _option_dest([f for f in flags if f])
        if not dest:
            return
        action = _string(keywords["action"]) if "action" in keywords else None
        default = keywords.get("default")
        self.options.setdefault(dest, []).append(
            Option(dest=dest, default=default, type=keywords.get("type"), action=action, scope=scope, statement=statement)
        )

    def _map_expressions(self, scope: Scope) -> dict[cst.CSTNode, cst.CSTNode]:
        """Every expression node of the scope's own statements -> its statement."""
        mapping: dict[cst.CSTNode, cst.CSTNode] = {}
        for statement in self.statements.get(scope, ()):
            for root in _expression_roots(statement):
                stack = [root]
                while stack:
                    node = stack.pop()
                    mapping[node] = statement
                    node_type = type(node)
                    fields = _FIELDS.get(node_type)
                    if fields is None:
                        fields = _FIELDS[node_type] = child_fields(node_type)
                    for field_name in fields:
                        value = getattr(node, field_name)
                        if value is None:
                            continue
                        if type(value) is tuple or type(value) is list:
                            stack.extend(child for child in value if is_node(child))
                        elif is_node(value):
                            stack.append(value)
        return mapping


def _expression_roots(statement: cst.CSTNode) -> list[cst.CSTNode]:
    """The parts of a statement that are not nested statements, with the
    small statements of a one-line suite (`if x: a = 1`), which it owns."""
    kind = type(statement)
    if kind is cst.SimpleStatementLine:
        return list(statement.body)
    roots: list[cst.CSTNode] = []
    if kind is cst.For:
        roots = [statement.target, statement.iter]
    elif kind is cst.While or kind is cst.If:
        roots = [statement.test]
    elif kind is cst.With:
        roots = list(statement.items)
    elif kind is cst.FunctionDef:
        roots = [*statement.decorators, statement.params]
    elif kind is cst.ClassDef:
        roots = [*statement.decorators, *statement.bases, *statement.keywords]
    elif kind is cst.ExceptHandler and statement.type is not None:
        roots = [statement.type]
    elif kind is cst.Match:
        roots = [statement.subject]
    body = getattr(statement, "body", None)
    if type(body) is cst.SimpleStatementSuite:
        roots.extend(body.body)
    return roots


def _target_key(target: cst.BaseExpression) -> str | None:
    """The key a binding is recorded under: `x`, `self.dim`, `config.hidden`
    for `config["hidden"] = ...` (attribute and string subscript alike)."""
    kind = type(target)
    if kind is cst.Name or kind is cst.Attribute:
        return dotted_name(target)
    if kind is cst.Subscript and len(target.slice) == 1:
        index = target.slice[0].slice
        if type(index) is cst.Index:
            key = _string(index.value)
            base = _target_key(target.value)
            if key is not None and base is not None and key.isidentifier():
                return f"{base}.{key}"
    return None


def _target_names(target: cst.BaseExpression) -> list[str]:
    kind = type(target)
    if kind is cst.Name or kind is cst.Attribute or kind is cst.Subscript:
        key = _target_key(target)
        return [key] if key else []
    if kind is cst.Tuple or kind is cst.List:
        names = []
        for element in target.elements:
            names.extend(_target_names(element.value))
        return names
    if kind is cst.StarredElement:
        return _target_names(target.value)
    return []


def _imported_names(node: cst.Import | cst.ImportFrom) -> list[str]:
    if type(node) is cst.ImportFrom and isinstance(node.names, cst.ImportStar):
        return []
    names = []
    for alias in node.names:  # type: ignore[union-attr]
        if alias.asname is not None and type(alias.asname.name) is cst.Name:
            names.append(alias.asname.name.value)
        else:
            dotted = dotted_name(alias.name)
            if dotted:
                names.append(dotted.split(".")[0] if type(node) is cst.Import else dotted)
    return names


def _string(expr: cst.BaseExpression) -> str | None:
    if type(expr) is cst.SimpleString:
        value = expr.evaluated_value
        return value if isinstance(value, str) else None
    return None


def _option_dest(flags: list[str]) -> str | None:
    """argparse's rule: the first long option, else the first short one, else
    the positional name; dashes become underscores."""
    if not flags:
        return None
    longs = [flag for flag in flags if flag.startswith("--")]
    chosen = longs[0] if longs else flags[0]
    return chosen.lstrip("-").replace("-", "_") or None
