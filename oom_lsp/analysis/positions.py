"""Positions of reported nodes, computed only around the reports.

libcst computes positions by generating the code of the whole module
(PositionProvider: about 1.8x the cost of the parse on real files). A finding
only needs the positions inside the statement it was reported in. The
stdlib `ast` (about 1/9 of a libcst parse) knows the line of every statement,
so we map the report's statement path (kept by the Tracker) onto the `ast`
tree, and generate the code of the innermost statement alone, starting at its
known line and indentation. When a fix touches nodes outside that statement,
the next enclosing statement is tried, then the whole module.

In the editor, most statements of a version are the very nodes of the
previous one (the incremental parse reuses unchanged chunks), so a
`PositionCache` kept with the document remembers each generated statement's
positions and the next version moves them by the lines the edit added or
removed, instead of generating the statement again.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections import OrderedDict
from collections.abc import Iterable, Sequence

import libcst as cst
from libcst._position import CodePosition, CodeRange
from libcst.metadata.position_provider import PositionProvidingCodegenState

from oom_lsp import python_ast

_NEWLINE_RE = re.compile(r"\r\n?|\n")

_CORRESPONDING: dict[type, tuple[type, ...]] = {
    cst.SimpleStatementLine: (ast.stmt,),
    cst.For: (ast.For, ast.AsyncFor),
    cst.While: (ast.While,),
    cst.If: (ast.If,),
    cst.With: (ast.With, ast.AsyncWith),
    cst.Try: (ast.Try,),
    cst.FunctionDef: (ast.FunctionDef, ast.AsyncFunctionDef),
    cst.ClassDef: (ast.ClassDef,),
    cst.Match: (getattr(ast, "Match", ast.stmt),),
}
if hasattr(ast, "TryStar"):
    _CORRESPONDING[cst.TryStar] = (ast.TryStar,)


class _PositionSink:
    """Stands in for a metadata provider: the codegen state only writes
    into `_computed`."""

    def __init__(self, computed: dict[cst.CSTNode, CodeRange]) -> None:
        self._computed = computed


def _block_statements(block: object) -> list[cst.CSTNode] | None:
    if isinstance(block, cst.IndentedBlock):
        return list(block.body)
    return None


def _child_blocks(
    statement: cst.CSTNode, node: ast.stmt
) -> list[tuple[Sequence[cst.CSTNode], Sequence[ast.stmt]]]:
    """Pairs of (libcst statements, ast statements) of each nested block."""
    pairs: list[tuple[Sequence[cst.CSTNode], Sequence[ast.stmt]]] = []

    def add(block: object, ast_block: Sequence[ast.stmt]) -> None:
        statements = _block_statements(block)
        if statements is not None:
            pairs.append((statements, ast_block))

    body = getattr(statement, "body", None)
    add(body, getattr(node, "body", []))
    orelse = getattr(statement, "orelse", None)
    if isinstance(orelse, cst.If):
        pairs.append(([orelse], getattr(node, "orelse", [])))
    elif isinstance(orelse, cst.Else):
        add(orelse.body, getattr(node, "orelse", []))
    for handler, ast_handler in zip(getattr(statement, "handlers", ()), getattr(node, "handlers", ())):
        add(handler.body, ast_handler.body)
    finalbody = getattr(statement, "finalbody", None)
    if isinstance(finalbody, cst.Finally):
        add(finalbody.body, getattr(node, "finalbody", []))
    for case, ast_case in zip(getattr(statement, "cases", ()), getattr(node, "cases", ())):
        add(case.body, ast_case.body)
    return pairs


def _ast_index(statements: Sequence[cst.CSTNode], target: cst.CSTNode) -> int | None:
    """Index in the ast block of `target`'s first ast statement."""
    index = 0
    for statement in statements:
        if statement is target:
            return index
        index += len(statement.body) if isinstance(statement, cst.SimpleStatementLine) else 1
    return None


@dataclasses.dataclass(frozen=True)
class _GeneratedStatement:
    """The positions a statement's codegen produced, its code starting on
    `first_line`. `statement` keeps the nodes alive, so ids stay unique."""

    statement: cst.CSTNode
    first_line: int
    positions: dict[cst.CSTNode, CodeRange]


class PositionCache:
    """Generated statements of earlier versions of one document, looked up by
    the statement's body: joining chunks copies a chunk's first statement to
    give it the comments above it, but the copy shares its body and header
    nodes with the original, and generates the same code below its leading
    lines."""

    MAX_STATEMENTS = 512

    def __init__(self) -> None:
        self._entries: OrderedDict[tuple[type, int, str, str, str], _GeneratedStatement] = OrderedDict()

    @staticmethod
    def _key(statement: cst.CSTNode, indent: str, module: cst.Module) -> tuple[type, int, str, str, str]:
        return (
            type(statement),
            id(getattr(statement, "body", None)),
            indent,
            module.default_indent,
            module.default_newline,
        )

    def get(self, statement: cst.CSTNode, indent: str, module: cst.Module) -> _GeneratedStatement | None:
        key = self._key(statement, indent, module)
        entry = self._entries.get(key)
        if entry is None or not _same_code_below_leading_lines(entry.statement, statement):
            return None
        self._entries.move_to_end(key)
        return entry

    def put(
        self, statement: cst.CSTNode, indent: str, module: cst.Module, entry: _GeneratedStatement
    ) -> None:
        key = self._key(statement, indent, module)
        self._entries[key] = entry
        self._entries.move_to_end(key)
        while len(self._entries) > self.MAX_STATEMENTS:
            self._entries.popitem(last=False)


def _same_code_below_leading_lines(old: cst.CSTNode, new: cst.CSTNode) -> bool:
    """Whether `new` is `old`, or a copy of it that differs only in the
    comments and blank lines above it (every other field the same object)."""
    if old is new:
        return True
    if type(old) is not type(new):
        return False
    return all(getattr(old, name) is getattr(new, name) for name in _fields_below_leading_lines(type(old)))


_FIELDS_BELOW: dict[type, tuple[str, ...]] = {}


def _fields_below_leading_lines(node_class: type) -> tuple[str, ...]:
    names = _FIELDS_BELOW.get(node_class)
    if names is None:
        names = _FIELDS_BELOW[node_class] = tuple(
            field.name for field in dataclasses.fields(node_class) if field.name != "leading_lines"
        )
    return names


def _moved(code_range: CodeRange, lines: int) -> CodeRange:
    if lines == 0:
        return code_range
    start, end = code_range.start, code_range.end
    return CodeRange(
        CodePosition(start.line + lines, start.column), CodePosition(end.line + lines, end.column)
    )


class PositionResolver:
    def __init__(
        self,
        module: cst.Module,
        source: str,
        statements: ast.Module | None = None,
        cache: PositionCache | None = None,
    ) -> None:
        self.module = module
        self.lines = _NEWLINE_RE.split(source)
        self.source = source
        self.positions: dict[cst.CSTNode, CodeRange] = {}
        self._cache = cache
        # Statements whose positions come from the cache, moved lazily: only
        # the few nodes a finding needs are ever asked for.
        self._reused: list[tuple[_GeneratedStatement, cst.CSTNode, int]] = []
        # The stdlib tree of `source`; False: not parsed yet.
        self._tree: ast.Module | None | bool = statements if statements is not None else False
        self._generated: set[int] = set()
        self._whole_module_done = False
        self._elif_ids: set[int] = set()

    def range_of(self, node: cst.CSTNode) -> CodeRange | None:
        found = self.positions.get(node)
        if found is None and self._reused:
            for entry, statement, lines in self._reused:
                cached = entry.positions.get(entry.statement if node is statement else node)
                if cached is not None:
                    found = self.positions[node] = _moved(cached, lines)
                    break
        return found

    def ensure(self, nodes: Iterable[cst.CSTNode | None], path: Sequence[cst.CSTNode]) -> None:
        """Make the positions of `nodes` known, reported inside `path`
        (outermost statement first)."""
        wanted = [node for node in nodes if node is not None]
        if all(self.range_of(node) is not None for node in wanted):
            return
        located = self._locate(path)
        if located is not None:
            for statement, ast_statement in reversed(located):
                if id(statement) in self._elif_ids:
                    continue  # generated alone it would print `if`, not `elif`
                self._generate_statement(statement, ast_statement)
                if all(self.range_of(node) is not None for node in wanted):
                    return
        self._generate_module()

    def _ast_tree(self) -> ast.Module | None:
        if self._tree is False:
            try:
                self._tree = python_ast.parse(self.source)
            except (SyntaxError, ValueError, RecursionError):
                # libcst accepted what ast rejects (or the reverse): fall back
                # to generating the whole module.
                self._tree = None
        return self._tree  # type: ignore[return-value]

    def _locate(self, path: Sequence[cst.CSTNode]) -> list[tuple[cst.CSTNode, ast.stmt]] | None:
        if not path:
            return None
        tree = self._ast_tree()
        if tree is None:
            return None
        blocks: list[tuple[Sequence[cst.CSTNode], Sequence[ast.stmt]]] = [(self.module.body, tree.body)]
        located: list[tuple[cst.CSTNode, ast.stmt]] = []
        for statement in path:
            match = None
            for statements, ast_statements in blocks:
                index = _ast_index(statements, statement)
                if index is not None:
                    match = (index, ast_statements)
                    break
            if match is None:
                return None
            index, ast_statements = match
            if index >= len(ast_statements):
                return None
            ast_statement = ast_statements[index]
            expected = _CORRESPONDING.get(type(statement))
            if expected is None or not isinstance(ast_statement, expected):
                return None
            located.append((statement, ast_statement))
            blocks = _child_blocks(statement, ast_statement)
            if isinstance(statement, cst.If) and isinstance(statement.orelse, cst.If):
                self._elif_ids.add(id(statement.orelse))
        return located

    def _first_line(self, statement: cst.CSTNode, ast_statement: ast.stmt) -> int:
        """The line where `statement`'s code starts, leading comments excluded."""
        decorators = getattr(ast_statement, "decorator_list", None)
        if decorators:
            return min(decorator.lineno for decorator in decorators)
        return ast_statement.lineno

    def _generate_statement(self, statement: cst.CSTNode, ast_statement: ast.stmt) -> None:
        if id(statement) in self._generated or self._whole_module_done:
            return
        self._generated.add(id(statement))
        first_line = self._first_line(statement, ast_statement)
        line_text = self.lines[first_line - 1] if first_line - 1 < len(self.lines) else ""
        indent = line_text[: len(line_text) - len(line_text.lstrip(" \t"))]
        leading = len(getattr(statement, "leading_lines", ()))
        decorators = getattr(statement, "decorators", ())
        if decorators:
            leading += len(decorators[0].leading_lines)
        cached = self._cache.get(statement, indent, self.module) if self._cache is not None else None
        if cached is not None:
            self._reused.append((cached, statement, first_line - cached.first_line))
            return
        positions: dict[cst.CSTNode, CodeRange] = {}
        state = PositionProvidingCodegenState(
            default_indent=self.module.default_indent,
            default_newline=self.module.default_newline,
            provider=_PositionSink(positions),  # type: ignore[arg-type]
        )
        state.line = first_line - leading
        state.indent_tokens = [indent] if indent else []
        statement._codegen(state)
        self.positions.update(positions)
        if self._cache is not None:
            self._cache.put(
                statement, indent, self.module, _GeneratedStatement(statement, first_line, positions)
            )

    def _generate_module(self) -> None:
        if self._whole_module_done:
            return
        self._whole_module_done = True
        state = PositionProvidingCodegenState(
            default_indent=self.module.default_indent,
            default_newline=self.module.default_newline,
            provider=_PositionSink(self.positions),  # type: ignore[arg-type]
        )
        self.module._codegen(state)


def compute_positions(module: cst.Module) -> dict[cst.CSTNode, CodeRange]:
    """Positions of every node of `module` (libcst's PositionProvider, without
    the metadata wrapper's deep copy)."""
    resolver = PositionResolver(module, module.code)
    resolver._generate_module()
    return resolver.positions
