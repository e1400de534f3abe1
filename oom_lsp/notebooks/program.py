"""A notebook's code cells analysed as one program, findings and fixes mapped
back to the cells. Pure: cell texts and settings in, findings per cell out.

The cells are joined in document order, which is the order "Run All" (and a
fresh kernel) executes them, after their IPython escapes are masked
(`oom_lsp.notebooks.magics`). A cell that does not compile on its own is
reported there as OOM000 and left out, as IPython would fail that cell alone,
so one broken cell never hides the findings of the others. A finding's range
and fix are then made relative to its cell; a fix that would reach into
another cell or touch a masked escape is dropped (the finding stays).
"""

from __future__ import annotations

import ast
import bisect
import dataclasses
import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from oom_lsp import python_ast
from oom_lsp.analysis import registry
from oom_lsp.analysis.findings import Finding, Fix
from oom_lsp.analysis.settings import LintSettings
from oom_lsp.edits import Position, Range, TextEdit
from oom_lsp.notebooks.magics import MaskedCell, mask_cell

if TYPE_CHECKING:
    from oom_lsp.analysis.incremental import ParsedSource

MAX_FIX_PASSES = 10


@dataclass(frozen=True)
class CellText:
    """One code cell as the caller knows it."""

    key: Hashable  # the caller's handle: a cell index (CLI) or a cell URI (editor)
    source: str
    number: int | None = None  # "cell N" in output (1-based, markdown cells counted)


@dataclass(frozen=True)
class ProgramCell:
    cell: CellText
    masked: MaskedCell
    first_line: int  # where the cell starts in the program (1-based)
    line_count: int
    statements: int  # top-level statements (the program's module body holds them in cell order)

    def contains(self, position: Position) -> bool:
        return self.first_line <= position.line < self.first_line + self.line_count

    def to_cell(self, position: Position) -> Position:
        line = position.line - self.first_line + 1
        return Position(line, self.masked.column_in_cell(line, position.column))


@dataclass(frozen=True)
class Program:
    text: str
    cells: tuple[ProgramCell, ...]

    @property
    def cell_statements(self) -> tuple[int, ...]:
        return tuple(cell.statements for cell in self.cells)

    def cell_at(self, line: int) -> ProgramCell | None:
        index = bisect.bisect_right([cell.first_line for cell in self.cells], line) - 1
        if index < 0:
            return None
        cell = self.cells[index]
        return cell if line < cell.first_line + cell.line_count else None


@dataclass
class NotebookAnalysis:
    """Findings per cell key (every cell given has an entry), relative to the cell."""

    findings: dict[Hashable, list[Finding]]
    program: Program
    skipped: dict[Hashable, str]  # cells left out and why (a cell magic, a syntax error)

    def all_findings(self) -> list[Finding]:
        return [finding for findings in self.findings.values() for finding in findings]


@dataclass(frozen=True)
class PreparedCell:
    """What a cell's text gives on its own: its masked Python, and either why it
    does not compile (line, column, message) or how many top-level statements it has."""

    masked: MaskedCell
    problem: tuple[int, int, str] | int | None  # None when the cell is not Python or blank


def prepare_cell(source: str) -> PreparedCell:
    masked = mask_cell(source)
    if masked.text is None or not masked.text.strip():
        return PreparedCell(masked, None)
    return PreparedCell(masked, _syntax_error(masked.text))


def build_program(
    cells: Sequence[CellText],
    settings: LintSettings,
    prepare: Callable[[str], PreparedCell] = prepare_cell,
) -> tuple[Program, dict, dict]:
    """(the program, OOM000 findings per cell key, skipped cells: key -> why)."""
    parts: list[str] = []
    program_cells: list[ProgramCell] = []
    errors: dict[Hashable, list[Finding]] = {}
    skipped: dict[Hashable, str] = {}
    line = 1
    for cell in cells:
        prepared = prepare(cell.source)
        masked, problem = prepared.masked, prepared.problem
        if masked.text is None:
            skipped[cell.key] = masked.skipped or "not Python"
            continue
        if problem is None:
            continue  # blank
        if isinstance(problem, tuple):
            skipped[cell.key] = "syntax error"
            finding = _syntax_finding(problem, settings, cell.number)
            if finding is not None:
                errors[cell.key] = [finding]
            continue
        text = _program_text(masked.text)
        count = text.count("\n") + text.count("\r") - text.count("\r\n")
        program_cells.append(ProgramCell(cell, masked, line, count, problem))
        parts.append(text)
        line += count
    return Program("".join(parts), tuple(program_cells)), errors, skipped


def analyze_cells(
    cells: Sequence[CellText],
    settings: LintSettings,
    path: str = "<notebook>",
    parse: Callable | None = None,
    prepare: Callable[[str], PreparedCell] = prepare_cell,
) -> NotebookAnalysis:
    """Every finding of the notebook, relative to its cell."""
    return _analyze_program(cells, build_program(cells, settings, prepare), settings, path, parse)


def _analyze_program(
    cells: Sequence[CellText],
    built: tuple[Program, dict, dict],
    settings: LintSettings,
    path: str,
    parse: Callable | None,
) -> NotebookAnalysis:
    from oom_lsp.analysis.engine import analyze

    program, errors, skipped = built
    findings: dict[Hashable, list[Finding]] = {cell.key: list(errors.get(cell.key, ())) for cell in cells}
    if program.cells:
        arguments = {"cell_statements": program.cell_statements}
        if parse is not None:
            arguments["parse"] = parse
        for finding in analyze(program.text, settings, path, **arguments):
            located = _to_cell(finding, program)
            if located is not None:
                key, relative = located
                findings[key].append(relative)
    for cell_findings in findings.values():
        cell_findings.sort(key=lambda finding: (finding.range.start, finding.code))
    return NotebookAnalysis(findings, program, skipped)


class IncrementalNotebook:
    """Successive versions of one notebook (the editor's): a cell's masking and
    syntax check are kept by its text until the next version, so an edit
    prepares the edited cell only, and the joined program is parsed by an
    IncrementalParser, which parses again only the top-level statements the
    edit touched and moves the positions of the others. The program's stdlib
    tree (which says where its statements are) is joined from the cells' own,
    each kept by its text and first line: only the cells an edit changed or
    moved are compiled again. The rules still run on the whole program: a
    change in one cell can change another's findings."""

    def __init__(self) -> None:
        from oom_lsp.analysis.incremental import IncrementalParser

        self._parser = IncrementalParser()
        self._prepared: dict[str, PreparedCell] = {}
        self._trees: dict[tuple[str, int], ast.Module] = {}

    def analyze(self, cells: Sequence[CellText], settings: LintSettings, path: str) -> NotebookAnalysis:
        current: dict[str, PreparedCell] = {}

        def prepare(source: str) -> PreparedCell:
            prepared = current.get(source) or self._prepared.get(source) or prepare_cell(source)
            current[source] = prepared
            return prepared

        built = build_program(cells, settings, prepare)
        self._prepared = current
        program = built[0]

        def parse(source: str) -> ParsedSource:
            try:
                statements = self.program_tree(program)
            except (SyntaxError, ValueError, RecursionError, MemoryError):
                statements = None  # the parser's own ast.parse says what is wrong, as for a file
            return self._parser.parse(source, statements=statements)

        return _analyze_program(cells, built, settings, path, parse)

    def program_tree(self, program: Program) -> ast.Module:
        """`ast.parse(program.text)`, joined from the trees of its cells: a cell's
        tree is its text compiled below as many empty lines as precede it, so
        its line numbers are the program's. Each of the program's cells compiles
        on its own (build_program leaves the others out), so the program is
        their statements in order."""
        from oom_lsp import python_ast

        current: dict[tuple[str, int], ast.Module] = {}
        body: list[ast.stmt] = []
        type_ignores: list[ast.type_ignore] = []
        for cell in program.cells:
            text = _program_text(cell.masked.text or "")
            key = (text, cell.first_line)
            tree = current.get(key) or self._trees.get(key)
            if tree is None:
                tree = python_ast.parse("\n" * (cell.first_line - 1) + text)
            current[key] = tree
            body.extend(tree.body)
            type_ignores.extend(tree.type_ignores)
        self._trees = current
        return ast.Module(body=body, type_ignores=type_ignores)


def _program_text(masked_text: str) -> str:
    """A cell's masked text as the program holds it: ending with a line end."""
    return masked_text if masked_text.endswith(("\n", "\r")) else masked_text + "\n"


def _syntax_error(text: str) -> tuple[int, int, str] | int:
    """Where and why the cell does not parse on its own (top-level `await` is
    IPython's, and allowed), else how many top-level statements it has (libcst's
    count: simple statements sharing a line are one)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = compile(
                text,
                "<cell>",
                "exec",
                flags=ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT,
                dont_inherit=True,
            )
        return len({statement.lineno for statement in tree.body})
    except SyntaxError as error:
        problem = (error.lineno or 1, max((error.offset or 1) - 1, 0), error.msg)
    except ValueError as error:  # NUL bytes
        return 1, 0, str(error)
    except (RecursionError, MemoryError):
        return 1, 0, "the cell is nested too deeply to analyse"
    import libcst as cst

    try:
        module = python_ast.parse_module(text)
    except (cst.ParserSyntaxError, RecursionError):
        return problem
    return len(module.body)


def _syntax_finding(
    problem: tuple[int, int, str], settings: LintSettings, number: int | None
) -> Finding | None:
    meta = registry.INVALID_SYNTAX
    if meta.code not in settings.enabled:
        return None
    line, column, message = problem
    start = Position(max(line, 1), max(column, 0))
    return Finding(
        code=meta.code,
        name=meta.name,
        message=f"SyntaxError: {message}",
        range=Range(start, Position(start.line, start.column + 1)),
        severity=settings.severity_of(meta.code, meta.default_severity),
        statement_line=start.line,
        cell=number,
    )


def _to_cell(finding: Finding, program: Program) -> tuple[Hashable, Finding] | None:
    cell = program.cell_at(finding.range.start.line)
    if cell is None:
        return None
    end = finding.range.end
    last = Position(cell.first_line + cell.line_count, 0)  # just past the cell's last line
    end = min(end, last)
    relative = Range(cell.to_cell(finding.range.start), cell.to_cell(end))
    statement_line = (
        finding.statement_line - cell.first_line + 1
        if cell.contains(Position(finding.statement_line, 0))
        else relative.start.line
    )
    return cell.cell.key, dataclasses.replace(
        finding,
        range=relative,
        fix=_localize_fix(finding.fix, cell),
        statement_line=statement_line,
        cell=cell.cell.number,
    )


def _localize_fix(fix: Fix | None, cell: ProgramCell) -> Fix | None:
    """The fix in the cell's coordinates, or None when an edit reaches another cell,
    a line whose IPython escape was masked, or the cell runs dedented."""
    if fix is None or cell.masked.dedent:
        return None  # a dedented cell's edits would need its indentation back
    limit = Position(cell.first_line + cell.line_count, 0)
    edits = []
    for edit in fix.edits:
        start, end = edit.range.start, edit.range.end
        if not cell.contains(start) or end > limit:
            return None
        relative = Range(cell.to_cell(start), cell.to_cell(end))
        touched = range(relative.start.line, relative.end.line + 1)
        if any(line in cell.masked.masked_lines for line in touched):
            return None
        edits.append(TextEdit(relative, edit.new_text))
    return dataclasses.replace(fix, edits=tuple(edits))


@dataclass
class NotebookFixResult:
    sources: dict[Hashable, str]  # the new text of each cell a fix changed
    applied: int
    remaining: NotebookAnalysis


def fix_cells(
    cells: Sequence[CellText],
    settings: LintSettings,
    *,
    unsafe: bool = False,
    path: str = "<notebook>",
    only_keys: set[Hashable] | None = None,
) -> NotebookFixResult:
    """Apply fixes cell by cell until nothing more applies (as `fix_source`), every
    fix inside one cell; a pass after which a changed cell would not compile is
    dropped. `only_keys` limits the fixes to those cells (fix-all of one cell)."""
    from oom_lsp.analysis.autofix import apply_non_overlapping, select_fixes

    current = list(cells)
    applied_total = 0
    analysis = analyze_cells(current, settings, path)
    for _ in range(MAX_FIX_PASSES):
        updated = []
        applied_pass = 0
        for cell in current:
            if only_keys is not None and cell.key not in only_keys:
                updated.append(cell)
                continue
            fixes = select_fixes(analysis.findings.get(cell.key, []), unsafe=unsafe)
            if not fixes:
                updated.append(cell)
                continue
            text, applied = apply_non_overlapping(cell.source, fixes)
            if applied and text != cell.source:
                masked = mask_cell(text)
                if masked.text is None or isinstance(_syntax_error(masked.text), tuple):
                    updated.append(cell)
                    continue
                applied_pass += applied
                updated.append(dataclasses.replace(cell, source=text))
            else:
                updated.append(cell)
        if applied_pass == 0:
            break
        current = updated
        applied_total += applied_pass
        analysis = analyze_cells(current, settings, path)
    changed = {new.key: new.source for old, new in zip(cells, current) if new.source != old.source}
    return NotebookFixResult(changed, applied_total, analysis)
