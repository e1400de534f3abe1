"""The analysis: source text + settings -> findings. Pure; no I/O.

One libcst parse per file, every enabled rule in one batched pass (our own
walker: libcst's visit rebuilds every node). Positions
are computed only for files where a rule reported something (one codegen
pass), and files that mention no training framework are only checked for
syntax errors by CPython's parser.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
import warnings
import weakref
from collections.abc import Callable

import libcst as cst
from libcst._position import CodeRange

from oom_lsp.analysis import registry
from oom_lsp.analysis.context import FileContext, Tracker
from oom_lsp.analysis.facts.contexts import call_graph
from oom_lsp.analysis.facts.library import Grad
from oom_lsp.analysis.facts.project import FileSummary, ProjectFacts, summarize
from oom_lsp.analysis.findings import Applicability, Finding, Fix, Severity
from oom_lsp.analysis.incremental import ParsedSource, parse_whole
from oom_lsp.analysis.positions import PositionResolver, compute_positions
from oom_lsp.analysis.rule import FixSpec, Report, Rule
from oom_lsp.analysis.settings import LintSettings
from oom_lsp.analysis.suppressions import Suppression, apply_suppressions, parse_suppressions
from oom_lsp.analysis.walker import walk
from oom_lsp.edits import (
    DeleteStatement,
    InsertAfter,
    InsertBefore,
    InsertLinesAfter,
    InsertLinesBefore,
    Position,
    Range,
    Replace,
    TextEdit,
    split_lines,
)

# Files that mention none of these cannot contain a finding of any rule
# (`--batch-size` and `BATCH_SIZE` count: OOM101 reads argparse options and constants).
_RELEVANT_RE = re.compile(r"torch|(?i:batch[_-]?size)|transformers|lightning|accelerate")
_NEWLINE_RE = re.compile(r"\r\n?|\n")


def mentions_framework(source: str) -> bool:
    return _RELEVANT_RE.search(source) is not None


def analyze(
    source: str,
    settings: LintSettings,
    path: str = "<stdin>",
    parse: Callable[[str], ParsedSource] = parse_whole,
    cell_statements: tuple[int, ...] | None = None,
    project: ProjectFacts | None = None,
    observe: Callable[[FileContext], None] | None = None,
) -> list[Finding]:
    """All findings for one file's text, sorted by position. `parse` may be
    an IncrementalParser's, for successive versions of one document.
    `cell_statements`: the text is a notebook's code cells joined (oom_lsp.notebooks),
    each made of this many top-level statements, in order. `project`: what
    the other files of the project say about this file's functions. `observe`
    is called with the file's context once its rules have run (the project
    summary is read from it)."""
    findings: list[Finding] = []
    # Findings hidden at the default level still use their suppressions: a
    # `# oom: ignore[...]` written in strict mode is not "unused" by default.
    hidden: list[Finding] | None = (
        [] if not settings.strict and registry.UNUSED_SUPPRESSION.code in settings.enabled else None
    )
    if mentions_framework(source):
        legacy: list[Finding] = []
        try:
            parsed = parse(source)
        except cst.ParserSyntaxError as error:
            readable = _without_legacy_async_keyword(source)
            if readable is None:
                return _syntax_error(error, source, settings)
            try:
                parsed = parse(readable)
            except cst.ParserSyntaxError as remaining:
                return _legacy_async_error(source, settings) + _syntax_error(remaining, readable, settings)
            except RecursionError:
                return _syntax_error(error, source, settings)
            # The file still does not run on Python 3.7+: say so where it breaks, and check the rest.
            legacy = _legacy_async_error(source, settings)
            source_for_rules = readable
        except RecursionError:
            return _syntax_error_at(1, 0, "the file is nested too deeply to analyse", settings)
        else:
            source_for_rules = source
        findings = _run_rules(parsed, source_for_rules, settings, path, cell_statements, project, observe, hidden)
        if legacy:
            # Fixes are written from the renamed text: none is offered until the file parses.
            findings = legacy + [dataclasses.replace(finding, fix=None) for finding in findings]
    elif registry.INVALID_SYNTAX.code in settings.enabled:
        # No rule can fire here, but a syntax error is reported in every file, as Ruff does.
        problem = _compile_error(source)
        if problem is not None and not _libcst_parses(source, parse):
            return _syntax_error_at(*problem, settings)
    suppressions = parse_suppressions(source)
    if suppressions:
        apply_suppressions(hidden or [], suppressions)
        findings = apply_suppressions(findings, suppressions)
        if registry.UNUSED_SUPPRESSION.code in settings.enabled:
            findings += _unused_suppressions(suppressions, settings)
    findings.sort(key=lambda finding: (finding.range.start, finding.code))
    return findings


# `x.cuda(async=True)`: PyTorch 0.3's keyword, a syntax error since Python 3.7 made
# `async` a keyword. The argument is `non_blocking` since PyTorch 0.4.
_LEGACY_ASYNC_KEYWORD = re.compile(r"(?<=[(,])(\s*)async(\s*=)(?!=)")


def _without_legacy_async_keyword(source: str) -> str | None:
    """The text with each `async=` keyword argument renamed to a name of the
    same length (every position stays where it is), or None when it has none."""
    if "async" not in source:
        return None
    renamed, count = _LEGACY_ASYNC_KEYWORD.subn(lambda match: f"{match.group(1)}_sync{match.group(2)}", source)
    return renamed if count else None


def _legacy_async_error(source: str, settings: LintSettings) -> list[Finding]:
    match = _LEGACY_ASYNC_KEYWORD.search(source)
    assert match is not None
    start = match.start() + len(match.group(1))
    line = source.count("\n", 0, start) + 1
    column = start - (source.rfind("\n", 0, start) + 1)
    return _syntax_error_at(
        line, column, "`async=` is invalid since Python 3.7 (PyTorch's argument is `non_blocking=`)", settings
    )


def _compile_error(source: str) -> tuple[int, int, str] | None:
    """Where and why CPython rejects the text: 1-based line, 0-based column.
    Its compiler is C, about three times faster than libcst's parser (which
    the rules need), and builds no Python objects as `ast.parse` does."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences: the user's linter's business
            compile(source, "<analysed>", "exec", dont_inherit=True)
    except SyntaxError as error:
        return error.lineno or 1, max((error.offset or 1) - 1, 0), error.msg
    except ValueError as error:  # a NUL byte
        return 1, 0, str(error)
    except (RecursionError, MemoryError):
        return 1, 0, "the file is nested too deeply to analyse"
    return None


def _libcst_parses(source: str, parse: Callable[[str], ParsedSource]) -> bool:
    """What a file that mentions a framework is held to: syntax newer than the
    interpreter running oom-lsp that libcst knows is no error there either."""
    try:
        parse(source)
    except (cst.ParserSyntaxError, RecursionError):
        return False
    return True


_MOST_CODES_LISTED = 3


def _listed(entries: list[str]) -> str:
    """`OOM101, OOM102, OOM201 and 4 more`: the message stays one short line."""
    if len(entries) <= _MOST_CODES_LISTED:
        return ", ".join(entries)
    return f"{', '.join(entries[:_MOST_CODES_LISTED])} and {len(entries) - _MOST_CODES_LISTED} more"


_PARSER_PREFIX_RE = re.compile(r"^parser error: error at \d+:\d+: ")
# libcst lists every token it expected; past a few, CPython's word for it reads better.
_MOST_EXPECTED_SHOWN = 5


def _syntax_error(error: cst.ParserSyntaxError, source: str, settings: LintSettings) -> list[Finding]:
    """At libcst's position, with CPython's message when it reports the same line (users know
    those: "expected ':'", "'(' was never closed"), else libcst's without its position."""
    message = _PARSER_PREFIX_RE.sub("", error.message.rstrip("."))
    python = _compile_error(source)
    if python is not None and python[0] == error.raw_line:
        message = python[2]
    elif message.startswith("expected one of") and message.count(",") >= _MOST_EXPECTED_SHOWN:
        message = "invalid syntax"
    # libcst's raw column can lie past the end of its raw line (seen: 11 on a 5-character line,
    # the column of the position its message names on the line before): it is put on the
    # line's last character, where an editor can draw it and where the CLI then says it is.
    lines = split_lines(source)
    column = error.raw_column
    if 0 < error.raw_line <= len(lines):
        column = min(column, max(len(lines[error.raw_line - 1]) - 1, 0))
    return _syntax_error_at(error.raw_line, column, message, settings)


def _syntax_error_at(line: int, column: int, message: str, settings: LintSettings) -> list[Finding]:
    meta = registry.INVALID_SYNTAX
    if meta.code not in settings.enabled:
        return []
    start = Position(max(line, 1), max(column, 0))
    return [
        Finding(
            code=meta.code,
            name=meta.name,
            message=f"SyntaxError: {message}",
            range=Range(start, Position(start.line, start.column + 1)),
            severity=settings.severity_of(meta.code, meta.default_severity),
            statement_line=start.line,
        )
    ]


def _run_rules(
    parsed: ParsedSource,
    source: str,
    settings: LintSettings,
    path: str,
    cell_statements: tuple[int, ...] | None = None,
    project: ProjectFacts | None = None,
    observe: Callable[[FileContext], None] | None = None,
    hidden: list[Finding] | None = None,
) -> list[Finding]:
    """The findings shown at the settings' level; with `hidden`, the findings
    of strict mode that the default level hides are appended to it."""
    module = parsed.module
    context = FileContext(
        source=source,
        module=module,
        settings=settings,
        path=path,
        syntax_tree=parsed.statements,
        cell_statements=cell_statements,
        project=project,
    )
    rules = [
        rule_class(context)
        for code, rule_class in registry.all_rules().items()
        if code in settings.enabled and _may_apply(rule_class, source)
    ]
    if not rules:
        if observe is not None:
            observe(context)
        return []
    context.tracker.entry_grad_off = _entry_grad_off(context)
    try:
        walk(
            module,
            rules,
            before_visit=context.tracker.before_visit,
            after_leave=context.tracker.after_leave,
            hooked_types=Tracker.HOOKED_TYPES,
        )
    except RecursionError:
        return _syntax_error_at(1, 0, "the file is nested too deeply to analyse", settings)
    if observe is not None:
        observe(context)
    if settings.strict:
        reports, hidden_reports = context.reports, []
    else:
        reports = [report for report in context.reports if report.shown_by_default]
        hidden_reports = [] if hidden is None else [r for r in context.reports if not r.shown_by_default]
    if not reports and not hidden_reports:
        return []
    resolver = PositionResolver(module, source, parsed.statements, parsed.positions)
    builder = _FixBuilder(context, resolver)

    def findings_of(reports: list[Report]) -> list[Finding]:
        findings = []
        for report in reports:
            resolver.ensure([report.node, report.statement, *_fix_nodes(report.fix)], report.statement_path)
            node_range = resolver.range_of(report.node)
            if node_range is None:
                continue
            statement_range = resolver.range_of(report.statement) if report.statement is not None else None
            rule = report.rule
            findings.append(
                Finding(
                    code=rule.code,
                    name=rule.name,
                    message=report.message,
                    range=_report_range(report.node, node_range, builder.lines),
                    severity=settings.severity_of(rule.code, report.severity or rule.default_severity),
                    fix=builder.build(report.fix) if report.fix else None,
                    statement_line=statement_range.start.line if statement_range else node_range.start.line,
                )
            )
        return _dedupe(findings)

    shown = findings_of(reports)
    if hidden is not None:
        hidden += findings_of(hidden_reports)
    return shown


def _may_apply(rule_class: type[Rule], source: str) -> bool:
    needs = rule_class.needs_any_of
    return not needs or any(word in source for word in needs)


def _entry_grad_off(context: FileContext) -> Callable[[cst.FunctionDef], bool]:
    """Whether every caller the file shows runs a function with autograd off
    (a `with torch.no_grad():` around each call, a decorated caller, a
    framework hook that runs without grad), from the file's call graph, built
    the first time a rule asks."""
    reference = weakref.ref(context)  # the tracker belongs to the context: no cycle through it

    def entered_without_grad(function: cst.FunctionDef) -> bool:
        owner = reference()
        if owner is None:
            return False
        graph = call_graph(owner)
        scope = graph.program.function(function)
        return scope is not None and graph.entry_grad(scope) == Grad.OFF

    return entered_without_grad


def _fix_nodes(spec: FixSpec | None) -> list[cst.CSTNode]:
    if spec is None:
        return []
    nodes: list[cst.CSTNode] = []
    for edit in spec.edits:
        for attr in ("node", "statement", "indent_like"):
            node = getattr(edit, attr, None)
            if isinstance(node, cst.CSTNode):
                nodes.append(node)
    return nodes


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen: set[tuple[str, Range]] = set()
    unique = []
    for finding in findings:
        key = (finding.code, finding.range)
        if key not in seen:
            seen.add(key)
            unique.append(finding)
    return unique


_COMPOUND = (cst.For, cst.While, cst.With, cst.If, cst.Try, cst.FunctionDef, cst.ClassDef)


def _report_range(node: cst.CSTNode, code_range: CodeRange, lines: list[str]) -> Range:
    """A compound statement is reported on its header line only: an editor
    should underline `for batch in loader:`, not the whole loop."""
    full = _to_range(code_range)
    if isinstance(node, _COMPOUND) and full.end.line > full.start.line:
        header = lines[full.start.line - 1] if full.start.line <= len(lines) else ""
        return Range(full.start, Position(full.start.line, len(header.rstrip())))
    return full


def _to_range(code_range: CodeRange) -> Range:
    return Range(
        Position(code_range.start.line, code_range.start.column),
        Position(code_range.end.line, code_range.end.column),
    )


class _FixBuilder:
    """Turns a rule's node-level FixSpec into text edits."""

    def __init__(self, context: FileContext, resolver: PositionResolver) -> None:
        self.context = context
        self.resolver = resolver
        self.lines = _NEWLINE_RE.split(context.source)
        self.newline = context.module.default_newline

    def build(self, spec: FixSpec) -> Fix | None:
        edits: list[TextEdit] = []
        for node_edit in spec.edits:
            edit = self._edit(node_edit)
            if edit is None:
                return None
            edits.append(edit)
        for module_name in spec.imports:
            if self.context.imports.reference_to(module_name) is None:
                edits.append(self._import_edit(module_name))
        edits.sort(key=lambda edit: (edit.range.start, edit.range.end))
        for before, after in zip(edits, edits[1:]):
            if after.range.start < before.range.end:
                return None
        return Fix(spec.title, tuple(edits), spec.applicability)

    def _range(self, node: cst.CSTNode) -> Range | None:
        code_range = self.resolver.range_of(node)
        return _to_range(code_range) if code_range is not None else None

    def _line(self, line: int) -> str:
        return self.lines[line - 1] if 0 < line <= len(self.lines) else ""

    def _indent_of(self, line: int) -> str:
        text = self._line(line)
        return text[: len(text) - len(text.lstrip())]

    def _indented(self, lines: tuple[str, ...], indent: str) -> str:
        unit = self.context.module.default_indent
        out = []
        for line in lines:
            body = line.lstrip(" ")
            depth = (len(line) - len(body)) // 4
            out.append(indent + unit * depth + body)
        return self.newline.join(out)

    def _edit(self, node_edit: object) -> TextEdit | None:
        if isinstance(node_edit, Replace):
            node_range = self._range(node_edit.node)
            if node_range is None:
                return None
            new = node_edit.new
            text = new if isinstance(new, str) else self.context.module.code_for_node(new)
            return TextEdit(node_range, text)
        if isinstance(node_edit, InsertBefore):
            node_range = self._range(node_edit.node)
            if node_range is None:
                return None
            return TextEdit(Range(node_range.start, node_range.start), node_edit.text)
        if isinstance(node_edit, InsertAfter):
            node_range = self._range(node_edit.node)
            if node_range is None:
                return None
            return TextEdit(Range(node_range.end, node_range.end), node_edit.text)
        if isinstance(node_edit, InsertLinesBefore):
            node_range = self._range(node_edit.statement)
            if node_range is None:
                return None
            indent = self._indent_of(node_range.start.line)
            if len(indent) != node_range.start.column:
                return None  # the statement shares its line with other code
            start = Position(node_range.start.line, 0)
            return TextEdit(Range(start, start), self._indented(node_edit.lines, indent) + self.newline)
        if isinstance(node_edit, InsertLinesAfter):
            node_range = self._range(node_edit.statement)
            if node_range is None:
                return None
            indent_node = node_edit.indent_like or node_edit.statement
            indent_range = self._range(indent_node)
            if indent_range is None:
                return None
            indent = self._indent_of(indent_range.start.line)
            end_line = node_range.end.line
            if node_range.end.column == 0 and end_line > node_range.start.line:
                end_line -= 1
            end = Position(end_line, len(self._line(end_line)))
            return TextEdit(Range(end, end), self.newline + self._indented(node_edit.lines, indent))
        if isinstance(node_edit, DeleteStatement):
            node_range = self._range(node_edit.statement)
            if node_range is None:
                return None
            if self._indent_of(node_range.start.line) != self._line(node_range.start.line)[: node_range.start.column]:
                return None
            end_line = node_range.end.line
            if node_range.end.column == 0 and end_line > node_range.start.line:
                end_line -= 1
            rest = self._line(end_line)[node_range.end.column:].strip()
            if rest and not rest.startswith("#") and node_range.end.column != 0:
                return None  # code follows on the same line (a comment goes with the statement)
            return TextEdit(
                Range(Position(node_range.start.line, 0), Position(end_line + 1, 0)),
                "",
            )
        raise TypeError(f"unknown edit {node_edit!r}")

    def _import_edit(self, module_name: str) -> TextEdit:
        """`import x` after the leading block of imports (or the docstring)."""
        anchor_line = 0
        for index, statement in enumerate(self.context.module.body):
            is_import = isinstance(statement, cst.SimpleStatementLine) and all(
                isinstance(small, (cst.Import, cst.ImportFrom)) for small in statement.body
            )
            if not (is_import or (index == 0 and _is_docstring(statement))):
                break
            self.resolver.ensure([statement], (statement,))
            statement_range = self._range(statement)
            if statement_range is not None:
                anchor_line = statement_range.end.line
        start = Position(anchor_line + 1, 0)
        return TextEdit(Range(start, start), f"import {module_name}{self.newline}")


def _is_docstring(statement: cst.CSTNode) -> bool:
    return (
        isinstance(statement, cst.SimpleStatementLine)
        and len(statement.body) == 1
        and isinstance(statement.body[0], cst.Expr)
        and isinstance(statement.body[0].value, (cst.SimpleString, cst.ConcatenatedString))
    )


def _unused_suppressions(suppressions: list[Suppression], settings: LintSettings) -> list[Finding]:
    meta = registry.UNUSED_SUPPRESSION
    findings = []
    for suppression in suppressions:
        if suppression.codes is None:
            continue
        unused = []
        for entry in suppression.codes:
            rule = registry.rule_for(entry.upper()) or registry.rule_by_name(entry.lower())
            if rule is None:
                if entry.upper().startswith("OOM"):
                    unused.append((entry, "unknown rule code"))
                continue  # another linter's code in a shared `# noqa:`
            if entry not in suppression.used and rule.code in settings.enabled:
                unused.append((entry, "suppresses nothing"))
        if not unused:
            continue
        # One group per reason: a comment with several stale codes still reads in one short line.
        grouped: dict[str, list[str]] = {}
        for entry, why in unused:
            grouped.setdefault(why, []).append(entry)
        described = "; ".join(f"{_listed(entries)} ({why})" for why, entries in grouped.items())
        findings.append(
            Finding(
                code=meta.code,
                name=meta.name,
                message=f"Unused suppression: {described}",
                range=suppression.comment_range,
                severity=settings.severity_of(meta.code, meta.default_severity),
                fix=_remove_codes_fix(suppression, {entry for entry, _ in unused}),
                statement_line=suppression.line,
            )
        )
    return findings


def _remove_codes_fix(suppression: Suppression, unused: set[str]) -> Fix:
    remaining = [code for code in suppression.codes or () if code not in unused]
    text = suppression.comment_text
    if remaining:
        pattern = _OOM_BRACKET if suppression.syntax == "oom" else _NOQA_CODES
        new_text = pattern.sub(lambda match: match.group(1) + ", ".join(remaining) + match.group(3), text, count=1)
        title = "Remove unused codes from the suppression"
    else:
        new_text = ""
        title = "Remove the unused suppression comment"
    return Fix(title, (TextEdit(suppression.comment_range, new_text),), Applicability.SAFE)


_OOM_BRACKET = re.compile(r"(#\s*oom:\s*(?:ignore-file|file-ignore|ignore)\s*\[)([^\]]*)(\])", re.IGNORECASE)
_NOQA_CODES = re.compile(r"(#\s*noqa:\s*)([A-Za-z0-9_\-]+(?:\s*,\s*[A-Za-z0-9_\-]+)*)()", re.IGNORECASE)

@dataclass(frozen=True)
class FileAnalysis:
    findings: list[Finding]
    # The calls this file makes into other modules of its project (None: not asked).
    summary: FileSummary | None


def analyze_file(
    source: str,
    settings: LintSettings,
    path: str,
    *,
    module: str | None = None,
    project: ProjectFacts | None = None,
    parse: Callable[[str], ParsedSource] = parse_whole,
    cell_statements: tuple[int, ...] | None = None,
) -> FileAnalysis:
    """`analyze`, and the file's project summary when `module` (its dotted name
    in the project) is given: the checker's two phases (oom_lsp.analysis.facts.project)."""
    summaries: list[FileSummary] = []

    def observe(context: FileContext) -> None:
        if module is not None:
            summaries.append(summarize(context, module))

    findings = analyze(
        source, settings, path, parse=parse, cell_statements=cell_statements, project=project, observe=observe
    )
    summary = summaries[0] if summaries else (FileSummary(module) if module is not None else None)
    return FileAnalysis(findings, summary)


__all__ = ["FileAnalysis", "analyze", "analyze_file", "compute_positions", "mentions_framework", "Severity"]
