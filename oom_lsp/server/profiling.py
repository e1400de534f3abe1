"""On-request memory measurements in the editor: `oom-lsp.profile`,
`oom-lsp.explainOom`, `oom-lsp.showReport` (docs/server-commands.md), and
what the estimate and lens modules share with them: running a subprocess job
with work-done progress and cancellation, the per-file results, the
`oomLsp/memoryStatus` notification and the diagnostics the results add.

User code never runs in the server: `oom_lsp.profiling.runner` runs it under
the user's interpreter in its own process group, and cancelling the request
(`$/cancelRequest`) or the progress (`window/workDoneProgress/cancel`) kills
that group.

Results belong to the text they were measured on. A result remembers the
document's version when the run started (None for a file that was not
open, adopted when it opens) and is dropped at the first look after the
document changed or closed: its diagnostics go, and the file's memory status
is reset (`peakBytes: null`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import attrs
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams, JsonRpcRequestCancelled
from pygls.uris import from_fs_path, to_fs_path

from oom_lsp.edits import Position, Range
from oom_lsp.profiling.oom_messages import OomError, find_ooms, format_bytes
from oom_lsp.profiling.report import Report
from oom_lsp.profiling.runner import ProfileError, ProfileRequest, ProfileRun
from oom_lsp.server import diagnostics
from oom_lsp.server.diagnostics import SOURCE
from oom_lsp.server.positions import PositionConverter, split_lines
from oom_lsp.server.protocol import RequestFailed
from oom_lsp.server.server import OomLanguageServer

logger = logging.getLogger(__name__)

PROFILE_COMMAND = "oom-lsp.profile"
EXPLAIN_COMMAND = "oom-lsp.explainOom"
SHOW_REPORT_COMMAND = "oom-lsp.showReport"
MEMORY_STATUS = "oomLsp/memoryStatus"
DEFAULT_PROFILE_TIMEOUT_S = 600.0
DEFAULT_STEPS = 3
MAX_LOG_CHARS = 4 * 2**20  # of a log given to explainOom: its end, where the error is
TOP_LINES_SHOWN = 5
RESULTS_FOLDER = ".oom_lsp"

T = TypeVar("T")


# --- per-file results ------------------------------------------------------------


@dataclass
class FileResult:
    """What one run says about one file."""

    kind: str  # "profile", "estimate" or "oom"
    report_path: str | None
    version: int | None  # the open document's version it was measured on; None: not open then
    diagnostics: list[types.Diagnostic] = field(default_factory=list)
    status: dict[str, Any] | None = None  # the memoryStatus sent for it, if any
    details: dict[str, Any] = field(default_factory=dict)  # what the estimate's hints and actions need
    when: float = field(default_factory=time.monotonic)


# uri -> kind -> result
_results: dict[str, dict[str, FileResult]] = {}
# uri -> kind -> the latest report, kept after an edit (showReport, validateFix compare with it).
_last_reports: dict[str, dict[str, tuple[float, str]]] = {}
# URIs whose results were published while the file was closed.
_pushed_closed: set[str] = set()


def current_results(ls: OomLanguageServer, uri: str) -> dict[str, FileResult]:
    """The file's results that still hold for its text; stale ones are
    dropped here (and the status bar reset) the first time they are seen."""
    results = _results.get(uri)
    if not results:
        return {}
    document = ls.open_document(uri)
    stale = []
    for kind, result in results.items():
        if document is None:
            if result.version is not None:
                stale.append(kind)  # measured on an open document that was closed since
        elif result.version is None:
            result.version = document.version  # opened since: holds until its first edit
        elif result.version != document.version:
            stale.append(kind)
    for kind in stale:
        dropped = results.pop(kind)
        if dropped.status is not None:
            send_memory_status(ls, {"uri": uri, "peakBytes": None, "source": dropped.kind})
        if kind == "estimate" and _supports_hint_refresh(ls):
            ls.workspace_inlay_hint_refresh(None)
    if not results:
        del _results[uri]
    return dict(results)


def _supports_hint_refresh(ls: OomLanguageServer) -> bool:
    return ls.client_supports("workspace.inlay_hint.refresh_support")


def store_result(ls: OomLanguageServer, uri: str, result: FileResult) -> None:
    """Keep the result and show its diagnostics (and nothing of a previous
    result of the same kind)."""
    _results.setdefault(uri, {})[result.kind] = result
    if result.report_path:
        _last_reports.setdefault(uri, {})[result.kind] = (result.when, result.report_path)
    republish(ls, uri)


def latest_report(uri: str, kinds: tuple[str, ...] = ("estimate", "profile")) -> str | None:
    """The file's most recent report of those kinds, even if the file changed
    since (oom-lsp.validateFix compares a fix with the measurement before it)."""
    reports = [report for kind, report in _last_reports.get(uri, {}).items() if kind in kinds]
    return max(reports)[1] if reports else None


def _extra_diagnostics(ls: OomLanguageServer, uri: str) -> list[types.Diagnostic]:
    """The diagnostics source registered with the diagnostics module."""
    if uri in _pushed_closed and ls.open_document(uri) is not None:
        # Published while the file was closed; now they come with its analysis.
        _pushed_closed.discard(uri)
        if ls.pull_diagnostics:
            ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))
    return [diagnostic for result in current_results(ls, uri).values() for diagnostic in result.diagnostics]


def republish(ls: OomLanguageServer, uri: str) -> None:
    """Send the file's diagnostics again: with its analysis when it is open,
    alone when it is not (an OOM in a file the user has not opened)."""
    if ls.open_document(uri) is None:
        results = current_results(ls, uri)
        _pushed_closed.add(uri)
        ls.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(
                uri=uri, diagnostics=[d for result in results.values() for d in result.diagnostics]
            )
        )
        return
    ls.forget_analyses(uri)
    if not ls.pull_diagnostics:
        diagnostics.schedule(ls, uri, 0)
    elif ls.client_supports("workspace.diagnostics.refresh_support"):
        ls.workspace_diagnostic_refresh(None)
    # A client that pulls without refresh (Neovim 0.11) sees them at its next pull.


def send_memory_status(ls: OomLanguageServer, status: dict[str, Any]) -> None:
    ls.protocol.notify(MEMORY_STATUS, status)


# --- jobs: progress and cancellation -------------------------------------------------


# (kind, script) of the jobs running: a second run of the same kind on the
# same script would write over the first one's output folder.
_running_jobs: set[tuple[str, Path]] = set()


class Job:
    """One long command: its cancel event (set by `$/cancelRequest`, by the
    progress' cancel button, or when the server cancels the task) and its
    work-done progress, reported from any thread."""

    def __init__(self, ls: OomLanguageServer, title: str, kind: str, script: Path) -> None:
        self.key = (kind, script.resolve())
        if self.key in _running_jobs:
            raise RequestFailed(f"{title}: already running; cancel it or wait for it")
        self.ls = ls
        self.title = title
        self.cancel = threading.Event()
        self.token: str | None = None
        self._loop = asyncio.get_running_loop()
        # $/cancelRequest cancels the request's future, not the task running
        # the command (pygls runs a command as a second handler behind the
        # executeCommand one): watch that future.
        request: Future[Any] | None = ls.protocol._request_futures.get(ls.protocol.msg_id)
        if request is not None:
            request.add_done_callback(self._on_request_done)

    def _on_request_done(self, request: Future[Any]) -> None:
        if request.cancelled():
            self.cancel.set()

    async def begin(self) -> None:
        if not self.ls.client_supports("window.work_done_progress"):
            return
        token = str(uuid.uuid4())
        try:
            await asyncio.wait_for(self.ls.work_done_progress.create_async(token), timeout=5)
        except asyncio.TimeoutError:
            logger.warning("The client did not answer the progress creation; no progress shown")
            return
        self.token = token
        self.ls.work_done_progress.tokens[token].add_done_callback(self._on_progress_done)
        self.ls.work_done_progress.begin(
            token, types.WorkDoneProgressBegin(title=self.title, cancellable=True, percentage=0)
        )

    def _on_progress_done(self, future: Any) -> None:
        if future.cancelled():
            self.cancel.set()

    def report(self, message: str, percentage: int | None = None) -> None:
        """Thread-safe."""
        if self.token is None:
            return
        value = types.WorkDoneProgressReport(message=message, percentage=percentage)
        self._loop.call_soon_threadsafe(self._send_report, value)

    def _send_report(self, value: types.WorkDoneProgressReport) -> None:
        if self.token is not None:
            self.ls.work_done_progress.report(self.token, value)

    def end(self, message: str) -> None:
        if self.token is not None:
            self.ls.work_done_progress.end(self.token, types.WorkDoneProgressEnd(message=message))
            self.token = None

    async def run(self, work: Callable[[], T]) -> T:
        """`work` in a thread; it must stop soon after `self.cancel` is set."""
        _running_jobs.add(self.key)
        self.ls.job_cancels.add(self.cancel)
        try:
            return await self._run(work)
        finally:
            _running_jobs.discard(self.key)
            self.ls.job_cancels.discard(self.cancel)

    async def _run(self, work: Callable[[], T]) -> T:
        await self.begin()
        running = asyncio.ensure_future(asyncio.to_thread(work))
        try:
            result = await asyncio.shield(running)
        except asyncio.CancelledError:
            self.cancel.set()
            # The run stops at once; its script is free again (and the progress ends) once
            # its process group is gone.
            await asyncio.gather(running, return_exceptions=True)
            self.end("cancelled")
            raise
        except Exception:
            if not self.cancel.is_set():
                self.end("failed")
                raise
            # Stopped because it was cancelled: answer that, not how it stopped.
        if self.cancel.is_set():
            self.end("cancelled")
            # An error answer, not a cancelled task: pygls chains the command
            # behind the executeCommand handler and answers only from a result.
            raise JsonRpcRequestCancelled(f"{self.title}: cancelled")
        self.end("done")
        return result


# --- shared helpers ------------------------------------------------------------------


def script_of(uri: str) -> Path:
    path = to_fs_path(uri)
    if path is None:
        raise JsonRpcInvalidParams(f"{uri}: not a file on disk (save it first)")
    script = Path(path)
    if not script.is_file():
        raise JsonRpcInvalidParams(f"{script}: no such file")
    return script


def command_setting(ls: OomLanguageServer, key: str) -> Any:
    return ls.editor.commands.get(key)


def interpreter(ls: OomLanguageServer, given: str | None) -> str:
    """The Python that runs the user's code: the argument, else the
    `oomLsp.interpreter` setting, else the server's own."""
    configured = command_setting(ls, "interpreter")
    if given:
        return given
    if isinstance(configured, str) and configured:
        return configured
    return sys.executable


def require_trusted_workspace(ls: OomLanguageServer, what: str) -> None:
    """RequestFailed when the editor has not trusted the workspace (VS Code's restricted
    mode): `what` would run its code."""
    if not ls.editor.workspace_trusted:
        raise RequestFailed(
            f"{what} runs this workspace's code, and the workspace is not trusted: trust it "
            "(VS Code: Manage Workspace Trust) to run it"
        )


def results_folder(ls: OomLanguageServer, script: Path, kind: str) -> Path:
    """`.oom_lsp/<kind>/` under the file's project root."""
    root = ls.lint_settings.project_config(script).root
    return Path(root) / RESULTS_FOLDER / kind


def write_result(ls: OomLanguageServer, script: Path, kind: str, name: str, text: str) -> Path:
    """Write `.oom_lsp/<kind>/<name>` of the script's project (oom_lsp.safe_files: nothing
    through a link a cloned repository planted there); RequestFailed when it cannot be."""
    from oom_lsp import safe_files

    root = Path(ls.lint_settings.project_config(script).root)
    path = results_folder(ls, script, kind) / name
    try:
        return safe_files.write_file(path, text, root=root)
    except OSError as error:
        raise RequestFailed(f"the {kind} ran, but its result was not written: {error.strerror or error}") from None


def line_range(ls: OomLanguageServer, uri: str, line: int) -> types.Range:
    """The text of a 1-based line, without its indentation, in the client's
    position encoding (the open document's text, else the file on disk)."""
    document = ls.open_document(uri)
    if document is not None:
        source = document.source
    else:
        path = to_fs_path(uri)
        try:
            source = Path(path).read_text(encoding="utf-8", errors="replace") if path else ""
        except OSError:
            source = ""
    lines = split_lines(source)
    text = lines[line - 1] if 0 < line <= len(lines) else ""
    start = len(text) - len(text.lstrip())
    converter = PositionConverter(source, ls.position_encoding)
    return converter.range_to_lsp(
        Range(Position(line, start), Position(line, max(len(text.rstrip()), start)))
    )


def uri_of_file(ls: OomLanguageServer, file: str, base: Path | None) -> str | None:
    """The URI of a file named in a report or a traceback (relative names
    from `base`); the open document's own URI when it is open."""
    path = Path(file)
    if not path.is_absolute():
        if base is None:
            return None
        path = base / path
    if not path.is_file():
        return None
    resolved = path.resolve()
    for document in ls.open_documents():
        if document.path and Path(document.path).resolve() == resolved:
            return document.uri
    return from_fs_path(str(resolved))


def document_version(ls: OomLanguageServer, uri: str) -> int | None:
    document = ls.open_document(uri)
    return document.version if document is not None else None


# --- oom-lsp.profile -------------------------------------------------------------------


class OutputRelay:
    """The profiled script's output to the server's log (the client's output panel, through
    `window/logMessage`, and the log file): in batches of what arrived within `EVERY_S`,
    each line cut at `MAX_LINE_CHARS`, and at most `MAX_LINES` lines a run. A script that
    prints a million lines used to send a million notifications and grow the log to
    900 MB; the report keeps the last lines anyway (`output_tail`). Thread-safe: the
    runner's reader thread calls `line`."""

    EVERY_S = 0.5
    MAX_LINES = 2000
    MAX_LINE_CHARS = 2000

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._pending: list[str] = []
        self._sent = 0
        self._dropped = 0
        self._timer: threading.Timer | None = None

    def line(self, text: str) -> None:
        with self._lock:
            if self._sent + len(self._pending) >= self.MAX_LINES:
                self._dropped += 1
                return
            if len(text) > self.MAX_LINE_CHARS:
                text = text[: self.MAX_LINE_CHARS] + f" … ({len(text) - self.MAX_LINE_CHARS:,} characters more)"
            self._pending.append(text)
            if self._timer is None:  # the first line of a batch: it goes out EVERY_S from now
                self._timer = threading.Timer(self.EVERY_S, self._flush_later)
                self._timer.daemon = True
                self._timer.start()

    def _flush_later(self) -> None:
        with self._lock:
            self._timer = None
            self._flush()

    def close(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._flush()
            if self._dropped:
                logger.info(
                    "[%s] … %d more lines of output not shown (the report keeps the last ones)",
                    self.name,
                    self._dropped,
                )

    def _flush(self) -> None:
        if self._pending:
            logger.info("[%s] %s", self.name, f"\n[{self.name}] ".join(self._pending))
            self._sent += len(self._pending)
            self._pending = []



@attrs.define
class ProfileArgs:
    uri: str
    steps: int | None = None
    args: list[str] | None = None
    python: str | None = None
    device: str = "auto"
    timeout: float | None = None


def _profile_settings(ls: OomLanguageServer) -> dict[str, Any]:
    value = command_setting(ls, "profile")
    return value if isinstance(value, dict) else {}


async def profile_command(ls: OomLanguageServer, args: ProfileArgs) -> dict[str, Any]:
    require_trusted_workspace(ls, "a profile")
    if args.device not in ("auto", "cpu", "cuda"):
        raise JsonRpcInvalidParams(f"device must be auto, cpu or cuda, not {args.device!r}")
    settings = _profile_settings(ls)
    script = script_of(args.uri)
    steps = args.steps or settings.get("steps") or DEFAULT_STEPS
    script_args = args.args if args.args is not None else list(settings.get("args") or [])
    out = results_folder(ls, script, "profile") / script.stem
    request = ProfileRequest(
        script=script,
        out=out,
        script_args=[str(arg) for arg in script_args],
        steps=int(steps),
        device=args.device,
        python=interpreter(ls, args.python),
        timeout=args.timeout or DEFAULT_PROFILE_TIMEOUT_S,
        cwd=ls.lint_settings.project_config(script).root,
    )
    version = document_version(ls, args.uri)
    job = Job(ls, f"Profiling {script.name}", "profile", script)

    def on_progress(event: dict[str, Any]) -> None:
        if event.get("event") == "step":
            step = int(event.get("step", 0))
            job.report(
                f"step {step}/{request.steps}: {format_bytes(event.get('peak_allocated'))} peak",
                min(99, int(100 * step / request.steps)),
            )
        elif event.get("event") == "analysing":
            job.report("reading the profile", 99)

    relay = OutputRelay(script.name)

    def work() -> Report:
        run = ProfileRun(request, on_progress, relay.line, cancel=job.cancel)
        run.start()
        try:
            return run.wait()
        finally:
            relay.close()

    try:
        report = await job.run(work)
    except ProfileError as error:
        raise RequestFailed(str(error)) from None
    report_path = out / "report.json"
    _show_profile(ls, args.uri, script, report, str(report_path), version)
    result: dict[str, Any] = {
        "reportPath": str(report_path),
        "peakBytes": report.peak_allocated,
        "device": report.device.type,
        "steps": len([step for step in report.steps if step.complete]),
        "status": report.status,
    }
    if report.peak_reserved is not None:
        result["reservedBytes"] = report.peak_reserved
    if report.oom is not None:
        result["oom"] = explain_dict(report.oom.error)
    if report.error is not None:
        result["error"] = report.error  # the script's own exception, "ValueError: corrupt shard 17"
    if report.status in ("timeout", "crashed", "error") and report.oom is None:
        result["message"] = "; ".join([*([report.error] if report.error else []), *report.notes]) or report.status
    return result


def _show_profile(
    ls: OomLanguageServer, uri: str, script: Path, report: Report, report_path: str, version: int | None
) -> None:
    """Information diagnostics on the top lines, an Error on the failing line
    of an OOM, and the memory status of the profiled file."""
    by_uri: dict[str, list[types.Diagnostic]] = {uri: []}
    base = script.parent
    shown: dict[str, int] = {}
    # Lines holding under 1% of the peak are noise on the source.
    noticeable = max(1, (report.peak_allocated or 0) // 100)
    for usage in report.top_lines:
        target = uri_of_file(ls, usage.file, base)
        if target is None or shown.get(target, 0) >= TOP_LINES_SHOWN or usage.bytes < noticeable:
            continue
        shown[target] = shown.get(target, 0) + 1
        by_uri.setdefault(target, []).append(
            types.Diagnostic(
                range=line_range(ls, target, usage.line),
                severity=types.DiagnosticSeverity.Information,
                source=SOURCE,
                message=f"{format_bytes(usage.bytes)} live at peak (profile: {report.device.type}, "
                f"{usage.allocations} allocation(s) still held at the run's peak)",
                data={"kind": "profile", "reportPath": report_path},
            )
        )
    if report.oom is not None and report.oom.error.failing_frame is not None:
        frame = report.oom.error.failing_frame
        target = uri_of_file(ls, frame.file, base)
        if target is not None:
            by_uri.setdefault(target, []).append(oom_diagnostic(ls, target, report.oom.error, "profile"))
    for target, found in by_uri.items():
        status = None
        if target == uri and report.peak_allocated is not None:
            total = report.device.total_memory
            status = {
                "uri": uri,
                "peakBytes": report.peak_allocated,
                "gpuMemoryBytes": total,
                "gpuName": report.device.name,
                "source": "profile",
                "reportPath": report_path,
                "exceedsGpu": report.oom is not None or (total is not None and report.peak_allocated > total),
            }
        store_result(
            ls,
            target,
            FileResult(
                kind="profile",
                report_path=report_path,
                version=version if target == uri else document_version(ls, target),
                diagnostics=found,
                status=status,
            ),
        )
        if status is not None:
            send_memory_status(ls, status)


# --- oom-lsp.explainOom ------------------------------------------------------------------


@attrs.define
class ExplainArgs:
    text: str | None = None
    path: str | None = None


def oom_diagnostic(ls: OomLanguageServer, uri: str, oom: OomError, origin: str) -> types.Diagnostic:
    frame = oom.failing_frame
    assert frame is not None
    facts = [f"tried to allocate {format_bytes(oom.tried_to_allocate)}"] if oom.tried_to_allocate else []
    if oom.total_capacity is not None:
        facts.append(f"{format_bytes(oom.total_capacity)} total")
    if oom.allocated is not None:
        facts.append(f"{format_bytes(oom.allocated)} allocated by PyTorch")
    if oom.free is not None:
        facts.append(f"{format_bytes(oom.free)} free")
    where = f" on {oom.device}" if oom.device else ""
    return types.Diagnostic(
        range=line_range(ls, uri, frame.line),
        severity=types.DiagnosticSeverity.Error,
        source=SOURCE,
        message=f"Out of memory here{where} ({origin}): {', '.join(facts) or oom.message}"
        + (f". {oom.hint}" if oom.hint else ""),
        # `error`: what "Ask AI to fix this OOM" (server/ai.py) sends to the model.
        data={"kind": "oom", "origin": origin, "error": oom.to_dict()},
    )


def explain_dict(oom: OomError) -> dict[str, Any]:
    frame = oom.failing_frame
    return {
        "triedToAllocate": oom.tried_to_allocate,
        "totalCapacity": oom.total_capacity,
        "allocated": oom.allocated,
        "reserved": oom.reserved,
        "free": oom.free,
        "device": oom.device,
        "hint": oom.hint,
        "message": oom.message,
        "frame": (
            {"path": frame.file, "line": frame.line, "function": frame.function, "code": frame.code}
            if frame is not None
            else None
        ),
    }


async def explain_command(ls: OomLanguageServer, args: ExplainArgs) -> dict[str, Any]:
    if (args.text is None) == (args.path is None):
        raise JsonRpcInvalidParams("give one of text or path")
    base = Path(ls.workspace.root_path) if ls.workspace.root_path else None
    if args.path is not None:
        log = Path(args.path)
        try:
            text = await asyncio.to_thread(_read_log_tail, log)
        except OSError as error:
            raise JsonRpcInvalidParams(f"{log}: {error.strerror or error}") from None
        base = log.parent if base is None else base
    else:
        text = (args.text or "")[-MAX_LOG_CHARS:]
    # Off the event loop: a 20 MB log took 22.7 s, and every other request waited.
    ooms = await asyncio.to_thread(find_ooms, text)
    by_uri: dict[str, list[types.Diagnostic]] = {}
    for oom in ooms:
        frame = oom.failing_frame
        target = uri_of_file(ls, frame.file, base) if frame is not None else None
        if target is not None:
            by_uri.setdefault(target, []).append(oom_diagnostic(ls, target, oom, "explained log"))
    for target, found in by_uri.items():
        report_path = _write_explanation(ls, target, ooms)
        store_result(
            ls,
            target,
            FileResult(
                kind="oom", report_path=report_path, version=document_version(ls, target), diagnostics=found
            ),
        )
    return {"errors": [explain_dict(oom) for oom in ooms]}


def _read_log_tail(log: Path) -> str:
    """The last `MAX_LOG_CHARS` of a log: the error that ended a run is at its end."""
    with open(log, "rb") as stream:
        stream.seek(0, os.SEEK_END)
        stream.seek(max(0, stream.tell() - 4 * MAX_LOG_CHARS))
        return stream.read().decode("utf-8", errors="replace")[-MAX_LOG_CHARS:]


def _in_workspace(ls: OomLanguageServer, path: Path) -> bool:
    folders = [folder.uri for folder in ls.workspace.folders.values()] + (
        [ls.workspace.root_uri] if ls.workspace.root_uri else []
    )
    resolved = path.resolve()
    for uri in folders:
        root = to_fs_path(uri)
        if root and (resolved == Path(root).resolve() or Path(root).resolve() in resolved.parents):
            return True
    return False


def _write_explanation(ls: OomLanguageServer, uri: str, ooms: list[OomError]) -> str | None:
    """The facts as JSON under `.oom_lsp/explain/` (what showReport opens), for a file of
    the workspace: a log names whatever files its traceback went through, and the
    explanation must not be written into other projects' folders."""
    path = to_fs_path(uri)
    if path is None or not _in_workspace(ls, Path(path)):
        return None
    text = json.dumps({"ooms": [oom.to_dict() for oom in ooms]}, indent=2) + "\n"
    try:
        report = write_result(ls, Path(path), "explain", f"{Path(path).stem}.json", text)
    except RequestFailed as refused:
        logger.warning("%s", refused)
        return None
    return str(report)


# --- oom-lsp.showReport --------------------------------------------------------------------


@attrs.define
class ShowReportArgs:
    uri: str


def show_report_command(ls: OomLanguageServer, args: ShowReportArgs) -> dict[str, Any]:
    return {"reportPath": latest_report(args.uri, ("estimate", "profile", "oom"))}


def register(server: OomLanguageServer) -> None:
    server.command(PROFILE_COMMAND)(profile_command)
    server.command(EXPLAIN_COMMAND)(explain_command)
    server.command(SHOW_REPORT_COMMAND)(show_report_command)
    diagnostics.add_extra_source(_extra_diagnostics)
