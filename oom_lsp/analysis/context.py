"""Per-file state shared by all rules of one pass.

- `ImportMap`: which local names are bound to which torch objects. A light
  pass of our own (libcst's Scope and QualifiedName providers cost ~8x the
  parse on real files): `import torch as T`, `import torch.nn.functional as F`,
  `from torch import cat` count; a module-level `def cat` or `cat = ...`
  after the import unbinds it.
- `Tracker`: where the traversal is (statement, function, loop body,
  no_grad / autocast regions), maintained from the batched visitor's
  before/after hooks so every rule sees the same, consistent state during
  both `visit_X` and `leave_X` of a node.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import libcst as cst

from oom_lsp import python_ast

if TYPE_CHECKING:
    from oom_lsp.analysis.facts.project import ProjectFacts
    from oom_lsp.analysis.rule import Report
    from oom_lsp.analysis.settings import LintSettings


def dotted_name(expr: cst.BaseExpression) -> str | None:
    """`a.b.c` for a Name/Attribute chain, else None."""
    # Exact type tests: libcst has no subclasses of Attribute and Name, and
    # isinstance() on its classes goes through ABCMeta (the hottest call here).
    parts: list[str] = []
    while type(expr) is cst.Attribute:
        parts.append(expr.attr.value)
        expr = expr.value
    if type(expr) is not cst.Name:
        return None
    parts.append(expr.value)
    return ".".join(reversed(parts))


def _module_name(node: cst.BaseExpression) -> str | None:
    return dotted_name(node)


class ImportMap:
    def __init__(self) -> None:
        # local name -> qualified name ("T" -> "torch", "cat" -> "torch.cat")
        self.bindings: dict[str, str] = {}
        # local name -> relative import ("BertModel" -> "..bert.modeling_bert.BertModel")
        self.relative: dict[str, str] = {}
        # qualified_name's answers by node (kept alive, so that its id stays
        # its own): every rule asks it of every call. Forgotten when an import
        # binds a name.
        self._qualified: dict[int, tuple[cst.BaseExpression, str | None]] = {}

    @classmethod
    def from_module(cls, module: cst.Module) -> ImportMap:
        imports = cls()
        imports._scan_block(module.body)
        return imports

    def _scan_block(self, body: object) -> None:
        for statement in body:  # type: ignore[attr-defined]
            if isinstance(statement, cst.SimpleStatementLine):
                for small in statement.body:
                    if isinstance(small, (cst.Import, cst.ImportFrom)):
                        self.add_import(small)
                    elif isinstance(small, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
                        self._unbind_targets(small)
            elif isinstance(statement, (cst.FunctionDef, cst.ClassDef)):
                self.bindings.pop(statement.name.value, None)
            elif isinstance(statement, (cst.If, cst.Try, cst.With)):
                # `if TYPE_CHECKING:`, `try: import x except ImportError:`
                for block in _blocks_of(statement):
                    self._scan_block(block)

    def _unbind_targets(self, node: cst.BaseSmallStatement) -> None:
        # `except ImportError: flash_attn_func = None`: a name that is None cannot
        # be called or have attributes, so code using the name uses the import.
        value = getattr(node, "value", None)
        if type(value) is cst.Name and value.value == "None":
            return
        targets: list[cst.BaseExpression] = []
        if isinstance(node, cst.Assign):
            targets = [target.target for target in node.targets]
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign)):
            targets = [node.target]
        for target in targets:
            if isinstance(target, cst.Name):
                self.bindings.pop(target.value, None)

    def add_import(self, node: cst.Import | cst.ImportFrom) -> None:
        self._qualified.clear()
        if isinstance(node, cst.Import):
            for alias in node.names:
                full = _module_name(alias.name)
                if full is None:
                    continue
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    self.bindings[alias.asname.name.value] = full
                else:
                    top = full.split(".")[0]
                    self.bindings[top] = top
            return
        if isinstance(node.names, cst.ImportStar):
            return
        if node.relative:
            # `from ..bert.modeling_bert import BertModel` inside a library: the
            # module it names, kept apart (no relative name is torch's).
            dots = "." * len(node.relative)
            package = _module_name(node.module) if node.module is not None else None
            prefix = f"{dots}{package}." if package else dots
            for alias in node.names:
                name = dotted_name(alias.name)
                if name is None:
                    continue
                local = name
                if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                    local = alias.asname.name.value
                self.relative[local] = prefix + name
            return
        if node.module is None:
            return
        module = _module_name(node.module)
        if module is None:
            return
        for alias in node.names:
            name = dotted_name(alias.name)
            if name is None:
                continue
            local = name
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            self.bindings[local] = f"{module}.{name}"

    def qualified_name(self, expr: cst.BaseExpression) -> str | None:
        """The fully qualified name `expr` refers to, if it is an imported one."""
        known = self._qualified.get(id(expr))
        if known is not None:
            return known[1]
        qualified = None
        dotted = dotted_name(expr)
        if dotted is not None:
            head, _, rest = dotted.partition(".")
            bound = self.bindings.get(head)
            if bound is not None:
                qualified = f"{bound}.{rest}" if rest else bound
        self._qualified[id(expr)] = (expr, qualified)
        return qualified

    def reference_to(self, qualified: str) -> str | None:
        """How this file can spell `qualified` with its current imports.

        "torch.nn.functional" -> "F" after `import torch.nn.functional as F`,
        "torch.nn.functional" after `import torch`, None when nothing binds it.
        """
        best: tuple[int, str] | None = None
        for local, bound in self.bindings.items():
            if qualified == bound or qualified.startswith(bound + "."):
                spelled = local + qualified[len(bound):]
                score = len(bound)
                if best is None or score > best[0]:
                    best = (score, spelled)
        return best[1] if best else None

    def is_bound(self, qualified_prefix: str) -> bool:
        return any(
            bound == qualified_prefix or bound.startswith(qualified_prefix + ".")
            for bound in self.bindings.values()
        )


def _blocks_of(statement: cst.CSTNode) -> list[object]:
    blocks: list[object] = []
    body = getattr(statement, "body", None)
    if isinstance(body, cst.IndentedBlock):
        blocks.append(body.body)
    for attr in ("orelse", "finalbody"):
        other = getattr(statement, attr, None)
        if isinstance(other, (cst.Else, cst.Finally)) and isinstance(other.body, cst.IndentedBlock):
            blocks.append(other.body.body)
        elif isinstance(other, cst.If):
            blocks.extend(_blocks_of(other))
    for handler in getattr(statement, "handlers", ()):
        if isinstance(handler.body, cst.IndentedBlock):
            blocks.append(handler.body.body)
    return blocks


_GRAD_DISABLING = {
    "torch.no_grad",
    "torch.inference_mode",
    "torch.autograd.no_grad",
    "torch.autograd.grad_mode.no_grad",
    "torch.autograd.grad_mode.inference_mode",
}
_AUTOCAST = {
    "torch.autocast",
    "torch.amp.autocast",
    "torch.cuda.amp.autocast",
    "torch.cpu.amp.autocast",
    "torch.amp.autocast_mode.autocast",
}

_STATEMENT_TYPES = (
    cst.SimpleStatementLine,
    cst.For,
    cst.While,
    cst.If,
    cst.With,
    cst.Try,
    cst.TryStar,
    cst.FunctionDef,
    cst.ClassDef,
    cst.Match,
)

# The same, and the other node types the tracker's hooks tell apart, as sets
# for exact type tests (libcst has no subclasses of these).
_STATEMENT_TYPE_SET = frozenset(_STATEMENT_TYPES)
_BLOCK_TYPES = frozenset({cst.IndentedBlock, cst.SimpleStatementSuite})
_LOOP_TYPES = frozenset({cst.For, cst.While})
_IMPORT_TYPES = frozenset({cst.Import, cst.ImportFrom})

_SET_GRAD_ENABLED = {"torch.set_grad_enabled", "torch.autograd.set_grad_enabled"}


# A decorator or context manager of the project that turns autograd off by
# its name (yolov5's `@smart_inference_mode()`): treating it as one can only
# silence findings, never add one.
_GRAD_DISABLING_WORDS = ("no_grad", "inference_mode")
_CONTEXT_MANAGER_DECORATORS = frozenset({"contextlib.contextmanager", "contextmanager"})


def _disabling_call(expr: cst.BaseExpression, imports: ImportMap) -> bool:
    """torch's own `no_grad()` / `inference_mode()` (not `inference_mode(False)`)."""
    target = expr.func if type(expr) is cst.Call else expr
    if imports.qualified_name(target) not in _GRAD_DISABLING:
        return False
    if type(expr) is cst.Call and expr.args:
        mode = expr.args[0].value
        return not (type(mode) is cst.Name and mode.value == "False")
    return True


def _grad_disabling_functions(module: cst.Module, imports: ImportMap) -> frozenset[str]:
    """Module-level functions of the file that turn autograd off for their
    caller: a `@contextmanager` that yields inside `with torch.no_grad():`,
    or a factory that returns `torch.no_grad()` / `torch.inference_mode()`."""
    found = set()
    for statement in module.body:
        if type(statement) is not cst.FunctionDef:
            continue
        is_context_manager = any(
            dotted_name(decorator.decorator) in _CONTEXT_MANAGER_DECORATORS for decorator in statement.decorators
        )
        if is_context_manager and _yields_under_no_grad(statement.body, imports):
            found.add(statement.name.value)
        elif _returns_grad_disabling(statement.body, imports):
            found.add(statement.name.value)
    return frozenset(found)


def _yields_under_no_grad(node: cst.CSTNode, imports: ImportMap) -> bool:
    for child in node.children:
        if type(child) in (cst.FunctionDef, cst.ClassDef, cst.Lambda):
            continue
        if type(child) is cst.With and any(_disabling_call(item.item, imports) for item in child.items):
            if _contains_yield(child.body):
                return True
        elif _yields_under_no_grad(child, imports):
            return True
    return False


def _contains_yield(node: cst.CSTNode) -> bool:
    if type(node) is cst.Yield:
        return True
    return any(
        _contains_yield(child) for child in node.children if type(child) not in (cst.FunctionDef, cst.Lambda)
    )


def _returns_grad_disabling(body: cst.BaseSuite, imports: ImportMap) -> bool:
    if type(body) is not cst.IndentedBlock:
        return False
    for statement in body.body:
        if type(statement) is not cst.SimpleStatementLine:
            continue
        for small in statement.body:
            if type(small) is cst.Return and small.value is not None and _disabling_call(small.value, imports):
                return True
    return False


@dataclass
class _FunctionFrame:
    function: cst.FunctionDef | None
    loops: list[cst.For | cst.While] = field(default_factory=list)
    # Depth of enclosing grad-disabling regions inside this frame.
    no_grad_depth: int = 0
    # Set by a `torch.set_grad_enabled(False)` statement, for what follows it.
    grad_switched_off: bool = False
    # Every caller enters the function with autograd off (worked out on first use).
    entered_without_grad: bool | None = None


class Tracker:
    """Where the traversal is. Read it from rules; it is kept by the engine."""

    # The node types whose entry and exit the hooks below need to see.
    HOOKED_TYPES: tuple[type, ...] = _STATEMENT_TYPES + (
        cst.IndentedBlock,
        cst.SimpleStatementSuite,
        cst.Lambda,
        cst.Import,
        cst.ImportFrom,
    )

    def __init__(self, imports: ImportMap, module: cst.Module) -> None:
        self._imports = imports
        self._local_grad_disabling = _grad_disabling_functions(module, imports)
        self.statements: list[cst.CSTNode] = []
        self._frames: list[_FunctionFrame] = [_FunctionFrame(function=None)]
        self._loop_blocks: list[cst.CSTNode] = []
        self._region_withs: list[tuple[cst.With, bool, bool]] = []
        self.autocast_depth = 0
        # Whether a function is entered with autograd off by every caller the
        # file shows (`oom_lsp.analysis.facts.contexts`); set by the engine.
        self.entry_grad_off: Callable[[cst.FunctionDef], bool] | None = None

    # --- state read by rules -------------------------------------------------
    @property
    def current_statement(self) -> cst.CSTNode | None:
        return self.statements[-1] if self.statements else None

    @property
    def functions(self) -> list[cst.FunctionDef]:
        return [frame.function for frame in self._frames if frame.function is not None]

    @property
    def current_function(self) -> cst.FunctionDef | None:
        return self._frames[-1].function

    @property
    def loops(self) -> list[cst.For | cst.While]:
        """Loops whose body encloses the current node, in the current function."""
        return self._frames[-1].loops

    @property
    def in_loop(self) -> bool:
        return bool(self._frames[-1].loops)

    @property
    def in_no_grad(self) -> bool:
        """Inside `torch.no_grad()` / `inference_mode()` (with or decorator),
        or in a function that every caller runs with autograd off."""
        frame = self._frames[-1]
        if frame.no_grad_depth > 0 or frame.grad_switched_off:
            return True
        if frame.entered_without_grad is None:
            frame.entered_without_grad = (
                frame.function is not None
                and self.entry_grad_off is not None
                and self.entry_grad_off(frame.function)
            )
        return frame.entered_without_grad

    @property
    def in_autocast(self) -> bool:
        return self.autocast_depth > 0

    def is_grad_disabling(self, expr: cst.BaseExpression) -> bool:
        """A decorator or context manager that turns autograd off: torch's
        (`no_grad()`, `inference_mode()`, `set_grad_enabled(False)`), a
        function of the file that wraps one, or a project helper named for
        it (`smart_inference_mode()`)."""
        if _disabling_call(expr, self._imports):
            return True
        target = expr.func if type(expr) is cst.Call else expr
        qualified = self._imports.qualified_name(target)
        if qualified in _SET_GRAD_ENABLED and type(expr) is cst.Call:
            first = expr.args[0].value if expr.args else None
            return type(first) is cst.Name and first.value == "False"
        if qualified is not None and qualified.startswith("torch."):
            return False
        dotted = dotted_name(target)
        if dotted is None:
            return False
        if dotted in self._local_grad_disabling and qualified is None:
            return True
        last = dotted.rpartition(".")[2].lower()
        return any(word in last for word in _GRAD_DISABLING_WORDS)

    def grad_switch(self, statement: cst.CSTNode) -> bool | None:
        """For a statement that changes the grad mode of the statements after
        it: True when it turns gradients off (`torch.set_grad_enabled(False)`,
        or a value we cannot read: precision first; `stack.enter_context(
        torch.no_grad())` in an `ExitStack`), False when it turns them on,
        None for any other statement."""
        # Exact type tests: called for every statement, by the walk and by the
        # data flow, and isinstance() misses on libcst's classes are slow (ABCMeta).
        if type(statement) is not cst.SimpleStatementLine or len(statement.body) != 1:
            return None
        small = statement.body[0]
        if type(small) is not cst.Expr or type(small.value) is not cst.Call:
            return None
        call = small.value
        if len(call.args) != 1:
            return None
        func = call.func
        if type(func) is cst.Attribute and func.attr.value == "enter_context":
            return True if self.is_grad_disabling(call.args[0].value) else None
        if self._imports.qualified_name(func) not in _SET_GRAD_ENABLED:
            return None
        mode = call.args[0].value
        return not (isinstance(mode, cst.Name) and mode.value == "True")

    def is_autocast(self, expr: cst.BaseExpression) -> bool:
        target = expr.func if isinstance(expr, cst.Call) else expr
        return self._imports.qualified_name(target) in _AUTOCAST

    # --- hooks called by the engine -----------------------------------------
    # Exact type tests: these run around every statement and block of the
    # walk, and isinstance() misses on libcst's classes are slow (ABCMeta).
    def before_visit(self, node: cst.CSTNode) -> None:
        node_type = type(node)
        if node_type in _STATEMENT_TYPE_SET:
            self.statements.append(node)
            if node_type is cst.FunctionDef:
                frame = _FunctionFrame(function=node)
                if any(self.is_grad_disabling(d.decorator) for d in node.decorators):
                    frame.no_grad_depth += 1
                self._frames.append(frame)
            elif node_type is cst.With:
                no_grad = any(self.is_grad_disabling(item.item) for item in node.items)
                autocast = any(self.is_autocast(item.item) for item in node.items)
                self._region_withs.append((node, no_grad, autocast))
        elif node_type in _BLOCK_TYPES:
            owner = self.current_statement
            if type(owner) in _LOOP_TYPES and owner.body is node:
                self._frames[-1].loops.append(owner)
                self._loop_blocks.append(node)
            elif type(owner) is cst.With and owner.body is node and self._region_withs:
                _, no_grad, autocast = self._region_withs[-1]
                if no_grad:
                    self._frames[-1].no_grad_depth += 1
                if autocast:
                    self.autocast_depth += 1
        elif node_type is cst.Lambda:
            enclosing = self._frames[-1]
            self._frames.append(_FunctionFrame(function=None, no_grad_depth=enclosing.no_grad_depth))

    def after_leave(self, node: cst.CSTNode) -> None:
        node_type = type(node)
        if node_type in _STATEMENT_TYPE_SET:
            self.statements.pop()
            switched = self.grad_switch(node)
            if switched is not None:
                self._frames[-1].grad_switched_off = switched
            if node_type is cst.FunctionDef:
                self._frames.pop()
            elif node_type is cst.With:
                self._region_withs.pop()
        elif node_type in _BLOCK_TYPES:
            if self._loop_blocks and self._loop_blocks[-1] is node:
                self._loop_blocks.pop()
                self._frames[-1].loops.pop()
                return
            owner = self.current_statement
            if type(owner) is cst.With and owner.body is node and self._region_withs:
                _, no_grad, autocast = self._region_withs[-1]
                if no_grad:
                    self._frames[-1].no_grad_depth -= 1
                if autocast:
                    self.autocast_depth -= 1
        elif node_type is cst.Lambda:
            self._frames.pop()
        elif node_type in _IMPORT_TYPES and len(self._frames) > 1:
            # Imports inside functions bind too (approximation: file-wide).
            self._imports.add_import(node)


class FileContext:
    """Everything a rule may read about the file being analysed."""

    def __init__(
        self,
        *,
        source: str,
        module: cst.Module,
        settings: LintSettings,
        path: str,
        syntax_tree: ast.Module | None = None,
        cell_statements: tuple[int, ...] | None = None,
        project: ProjectFacts | None = None,
    ) -> None:
        self.source = source
        # What the other files of the project say about this file's functions
        # (oom_lsp.analysis.facts.project); None when the file is analysed alone.
        self.project = project
        self.module = module
        self.settings = settings
        self.path = path
        self._syntax_tree = syntax_tree
        # A notebook's code cells joined into one program: how many of the module's
        # top-level statements each cell holds, in order. None for a file of Python
        # (the notebook rules stay silent there).
        self.cell_statements = cell_statements
        self.imports = ImportMap.from_module(module)
        self.tracker = Tracker(self.imports, module)
        self.reports: list[Report] = []

    def add_report(self, report: Report) -> None:
        self.reports.append(report)

    def syntax_tree(self) -> ast.Module | None:
        """The stdlib tree of the source (with line numbers, which libcst's
        nodes lack), parsed on first use when the parser did not keep it;
        None when `ast` rejects what libcst accepted."""
        if self._syntax_tree is None:
            try:
                self._syntax_tree = python_ast.parse(self.source)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                return None
        return self._syntax_tree

    def qualified_name(self, expr: cst.BaseExpression) -> str | None:
        return self.imports.qualified_name(expr)

    def call_name(self, call: cst.Call) -> str | None:
        """The qualified name of the called function, when it is imported."""
        return self.imports.qualified_name(call.func)

    def code_for(self, node: cst.CSTNode) -> str:
        return self.module.code_for_node(node)
