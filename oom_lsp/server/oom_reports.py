"""The runtime side in the editor: the OOM guard's reports as diagnostics, and
the actions that instrument a training script.

The guard (`oom_lsp.runtime.oom_guard`) writes `<root>/.oom_lsp/last_oom/report.json`
when a training run fails. The server watches that file (dynamically registered
for clients that can watch files; for the others, and as a safety net, its
modification time is checked whenever a document's diagnostics are computed)
and shows the OOM as an Error diagnostic on the failing line of the user's file,
with "Show the OOM report", "Set batch size to N" when an estimate found the
largest batch that fits, and the AI action of `oom_lsp.server.ai`.

"Insert memory monitoring" and "Guard with oom_guard" (`oom_lsp.fixes.instrument`)
are offered as `refactor.rewrite` actions on a training loop or training call.
"""

from __future__ import annotations

import asyncio
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import attrs
from lsprotocol import types
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument

from oom_lsp.edits import Position, Range, TextEdit
from oom_lsp.server import code_actions, diagnostics
from oom_lsp.server.positions import PositionConverter
from oom_lsp.server.server import OomLanguageServer

logger = logging.getLogger(__name__)

REPORT_GLOB = "**/.oom_lsp/last_oom/report.json"
OPEN_REPORT_COMMAND = "oom-lsp.openOomReport"
REPORT_KIND = "oom-report"
# The edit imports oom_lsp.runtime: the environment that runs the script needs oom-lsp.
MONITOR_TITLE = "oom-lsp: Insert memory monitoring (needs oom-lsp where it trains)"
GUARD_TITLE = "oom-lsp: Guard with oom_guard (needs oom-lsp where it trains)"
BATCH_RULE = "OOM101"
# An explicit `only` naming these asks for the rewrites (VS Code's Refactor... menu).
_REWRITE_KINDS = (types.CodeActionKind.Refactor, types.CodeActionKind.RefactorRewrite)


@attrs.define
class OpenReportArgs:
    path: str


@dataclass(frozen=True)
class _LoadedReport:
    stamp: int | None  # st_mtime_ns; None: no file
    diagnostic: Any  # oom_lsp.runtime.reports.OomDiagnostic | None


@dataclass(frozen=True)
class _Instrumentable:
    version: int | None
    loops: list[Any]  # TrainingLoop
    calls: list[Any]  # TrainingCall


@dataclass
class Reports:
    """What a server remembers of the OOM reports and the training loops (`ls.state(Reports)`)."""

    loaded: dict[Path, _LoadedReport] = field(default_factory=dict)
    roots: dict[Path, Path] = field(default_factory=dict)  # a document's folder -> its project root
    instrumentable: dict[str, _Instrumentable] = field(default_factory=dict)  # by URI


def register(server: OomLanguageServer) -> None:
    server.hooks.extra_diagnostics.append(report_diagnostics)
    server.hooks.watch_files([REPORT_GLOB], on_reports_changed)
    server.hooks.add_provider(list_actions)
    server.command(OPEN_REPORT_COMMAND)(open_report)


# --- the report and its diagnostic -------------------------------------------------------------


def _report_path(ls: OomLanguageServer, path: Path) -> Path:
    from oom_lsp.runtime.reports import LAST_OOM_DIR, REPORT_NAME, find_project_root

    folder = path.parent
    roots = ls.state(Reports).roots
    root = roots.get(folder)
    if root is None:
        root = roots[folder] = find_project_root(folder)
    return root / LAST_OOM_DIR / REPORT_NAME


def _stamp(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _latest(ls: OomLanguageServer, report: Path) -> Any:
    """The report's OomDiagnostic (or None), read again when the file changed."""
    from oom_lsp.profiling.report import ReportError
    from oom_lsp.runtime.reports import latest_oom_diagnostic

    stamp = _stamp(report)
    loaded = ls.state(Reports).loaded.get(report)
    if loaded is not None and loaded.stamp == stamp:
        return loaded.diagnostic
    diagnostic = None
    if stamp is not None:
        try:
            diagnostic = latest_oom_diagnostic(report)
        except ReportError as error:
            logger.warning("Ignoring the OOM report %s: %s", report, error)
        else:
            logger.info("OOM report %s: %s", report, diagnostic.message if diagnostic else "no OOM in it")
    ls.state(Reports).loaded[report] = _LoadedReport(stamp, diagnostic)
    return diagnostic


def _same_file(reported: str, path: Path, report: Path) -> bool:
    """Whether the frame's file (as the script saw it: absolute, or relative to
    where it was started) is this document's."""
    candidate = Path(reported)
    if not candidate.is_absolute():
        # Relative to the folder the run started in: the project root is the usual one.
        candidate = report.parent.parent.parent / candidate
    try:
        return os.path.samefile(candidate, path)
    except OSError:
        return os.path.abspath(candidate) == os.path.abspath(path)


def _failing_line(lines: list[str], line: int, code: str | None) -> int | None:
    """The 1-based line the OOM happened on in the document as it is now: the
    reported line while it still holds the reported code, else the one line
    that does (lines added above it since the run); None when none does."""
    if not code:
        return line if 1 <= line <= len(lines) else None
    wanted = code.strip()
    if 1 <= line <= len(lines) and lines[line - 1].strip() == wanted:
        return line
    matches = [number for number, text in enumerate(lines, 1) if text.strip() == wanted]
    return matches[0] if len(matches) == 1 else None


def report_diagnostics(ls: OomLanguageServer, uri: str) -> list[types.Diagnostic]:
    fs_path = to_fs_path(uri)
    document = ls.open_document(uri)
    if not fs_path or document is None:
        return []
    path = Path(fs_path)
    report = _report_path(ls, path)
    oom = _latest(ls, report)
    if oom is None or not _same_file(oom.path, path, report):
        return []
    lines = [text.rstrip("\r\n") for text in document.lines]
    line = _failing_line(lines, oom.line, oom.facts.get("code"))
    if line is None:
        return []
    text = lines[line - 1]
    start = len(text) - len(text.lstrip())
    converter = PositionConverter(document.source, ls.position_encoding)
    return [
        types.Diagnostic(
            range=converter.range_to_lsp(Range(Position(line, start), Position(line, len(text.rstrip())))),
            severity=types.DiagnosticSeverity.Error,
            source=diagnostics.SOURCE,
            message=oom.message,
            # `error` is what "Ask AI to fix this OOM" (server/ai.py) sends to the model.
            data={"kind": REPORT_KIND, **oom.facts},
        )
    ]


def on_reports_changed(ls: OomLanguageServer, changes: list[types.FileEvent]) -> None:
    if not any(change.uri.endswith("/.oom_lsp/last_oom/report.json") for change in changes):
        return
    logger.info("An OOM report changed; checking the open documents again")
    diagnostics.refresh_all(ls)


# --- actions -------------------------------------------------------------------------------------


async def list_actions(
    ls: OomLanguageServer, params: types.CodeActionParams, document: TextDocument
) -> list[types.CodeAction]:
    only = params.context.only
    actions: list[types.CodeAction] = []
    if code_actions.kind_wanted(only, types.CodeActionKind.QuickFix):
        for diagnostic in params.context.diagnostics:
            data: Any = diagnostic.data
            if (
                diagnostic.source == diagnostics.SOURCE
                and isinstance(data, dict)
                and data.get("kind") == REPORT_KIND
            ):
                actions.extend(await _report_actions(ls, document, diagnostic, data))
    if code_actions.kind_wanted(only, types.CodeActionKind.RefactorRewrite):
        asked = params.context.trigger_kind != types.CodeActionTriggerKind.Automatic or (
            only is not None and any(kind in _REWRITE_KINDS for kind in only)
        )
        actions.extend(await _instrument_actions(ls, document, params.range, headers_only=not asked))
    return actions


async def _report_actions(
    ls: OomLanguageServer, document: TextDocument, diagnostic: types.Diagnostic, facts: dict[str, Any]
) -> list[types.CodeAction]:
    actions = []
    shown = facts.get("prompt") or facts.get("report")
    if shown:
        actions.append(
            types.CodeAction(
                title="oom-lsp: Show the OOM report",
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[diagnostic],
                command=types.Command(
                    title="Show the OOM report", command=OPEN_REPORT_COMMAND, arguments=[{"path": shown}]
                ),
            )
        )
    fitting = ls.max_batch_by_uri.get(document.uri)
    if fitting is not None:
        batch = await _batch_size_action(ls, document, diagnostic, fitting)
        if batch is not None:
            actions.append(batch)
    return actions


async def _batch_size_action(
    ls: OomLanguageServer, document: TextDocument, diagnostic: types.Diagnostic, fitting: int
) -> types.CodeAction | None:
    """ "Set batch size to N": OOM101's fix of the literal batch size, whose limit is the largest
    batch an estimate of this file found to fit (the analysis already uses it)."""
    analysis = await ls.analysis_of(document)
    if not ls.is_current(analysis):
        return None
    fixes = [f for f in analysis.findings if f.code == BATCH_RULE and f.fix is not None]
    if len(fixes) != 1:
        return None  # none, or several literals: which one is the batch is not certain
    converter = PositionConverter(analysis.source, ls.position_encoding)
    edits = [
        types.TextEdit(range=converter.range_to_lsp(edit.range), new_text=edit.new_text)
        for edit in fixes[0].fix.edits
    ]
    return types.CodeAction(
        title=f"oom-lsp: Set batch size to {fitting}",
        kind=types.CodeActionKind.QuickFix,
        diagnostics=[diagnostic],
        edit=code_actions.workspace_edit(ls, document, edits),
    )


async def _instrumentable(ls: OomLanguageServer, document: TextDocument) -> _Instrumentable:
    from oom_lsp.fixes.instrument import find_training_calls, find_training_loops

    known = ls.state(Reports).instrumentable
    cached = known.get(document.uri)
    if cached is not None and cached.version == document.version:
        return cached
    source, version = document.source, document.version
    loop = asyncio.get_running_loop()
    loops = await loop.run_in_executor(ls.analysis_executor, find_training_loops, source)
    calls = await loop.run_in_executor(ls.analysis_executor, find_training_calls, source)
    found = _Instrumentable(version, loops, calls)
    for closed in [uri for uri in known if ls.open_document(uri) is None]:
        del known[closed]
    if ls.open_document(document.uri) is not None:
        known[document.uri] = found
    return found


async def _instrument_actions(
    ls: OomLanguageServer, document: TextDocument, selected: types.Range, headers_only: bool
) -> list[types.CodeAction]:
    """The rewrites for the targets under the selection; with `headers_only`
    (an automatic request, which a client sends on every cursor move), only
    for a target whose first line (a loop's header) is selected, so that no
    light bulb shows on the body's lines, where nothing is wrong."""
    from oom_lsp.fixes.instrument import guard_with_oom_guard, insert_memory_monitoring

    found = await _instrumentable(ls, document)
    first, last = selected.start.line + 1, selected.end.line + 1
    version, source = document.version, document.source
    actions = []
    for title, targets, build in (
        (MONITOR_TITLE, found.loops, insert_memory_monitoring),
        (GUARD_TITLE, found.calls, guard_with_oom_guard),
    ):
        # The innermost target under the selection, as the edit builders choose it.
        hits = [target for target in targets if target.line <= last and first <= target.end_line]
        if headers_only:
            hits = [target for target in hits if first <= target.line]
        if not hits:
            continue
        line = max(first, min(hit.line for hit in hits))
        edits: tuple[TextEdit, ...] | None = await asyncio.get_running_loop().run_in_executor(
            ls.analysis_executor, build, source, line
        )
        if edits is None or document.version != version:
            continue
        converter = PositionConverter(source, ls.position_encoding)
        lsp_edits = [
            types.TextEdit(range=converter.range_to_lsp(edit.range), new_text=edit.new_text) for edit in edits
        ]
        actions.append(
            types.CodeAction(
                title=title,
                kind=types.CodeActionKind.RefactorRewrite,
                edit=code_actions.workspace_edit(ls, document, lsp_edits),
            )
        )
    return actions


async def open_report(ls: OomLanguageServer, args: OpenReportArgs) -> dict[str, Any]:
    path = Path(args.path).resolve()
    if ls.client_supports("window.show_document.support"):
        shown = await ls.window_show_document_async(
            types.ShowDocumentParams(uri=path.as_uri(), take_focus=True)
        )
        if shown.success:
            return {"shown": True, "path": str(path)}
    others = sorted(str(p) for p in path.parent.glob("*") if p != path) if path.parent.is_dir() else []
    message = f"oom-lsp: the OOM report is {path}" + (f" (beside it: {', '.join(others)})" if others else "")
    ls.window_show_message(types.ShowMessageParams(type=types.MessageType.Info, message=message))
    return {"shown": False, "path": str(path)}
