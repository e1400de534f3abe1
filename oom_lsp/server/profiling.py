"""On-request memory measurements in the editor: `oom-lsp.profile`, `oom-lsp.explainOom`,
`oom-lsp.showReport` (docs/server-commands.md), over the use cases oom_lsp.usecases.profile and
oom_lsp.usecases.explain: the profile's lines and an OOM's failing line become diagnostics,
the profiled file's peak the `oomLsp/memoryStatus` notification (the jobs and results every
long command shares are in server/jobs.py).

User code never runs in the server: `oom_lsp.profiling.runner` runs it under
the user's interpreter in its own process group, and cancelling the request
(`$/cancelRequest`) or the progress (`window/workDoneProgress/cancel`) kills
that group.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams
from pygls.uris import from_fs_path, to_fs_path

from oom_lsp.config import ConfigError
from oom_lsp.edits import Position, Range
from oom_lsp.profiling.oom_messages import OomError
from oom_lsp.server.diagnostics import SOURCE
from oom_lsp.server.jobs import (
    FileResult,
    Job,
    command_setting,
    document_version,
    interpreter,
    latest_report,
    require_trusted_workspace,
    results_folder,
    script_of,
    send_memory_status,
    store_result,
    write_result,
)
from oom_lsp.server.positions import PositionConverter, split_lines
from oom_lsp.server.protocol import RequestFailed
from oom_lsp.server.server import OomLanguageServer
from oom_lsp.units import format_bytes

if TYPE_CHECKING:
    from oom_lsp.profiling.report import Report
    from oom_lsp.usecases.profile import ProfileOutcome

# The profile's and the explanation's use cases are imported when their command runs: the
# server's start-up, before the first diagnostics, does not pay them.

logger = logging.getLogger(__name__)

PROFILE_COMMAND = "oom-lsp.profile"
EXPLAIN_COMMAND = "oom-lsp.explainOom"
SHOW_REPORT_COMMAND = "oom-lsp.showReport"
DEFAULT_PROFILE_TIMEOUT_S = 600.0
DEFAULT_STEPS = 3
TOP_LINES_SHOWN = 5


# --- shared helpers ------------------------------------------------------------------


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
    from oom_lsp.usecases.profile import ProfileError, ProfileRequest, run_profile

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

    def work() -> ProfileOutcome:
        try:
            return run_profile(request, on_progress, relay.line, cancel=job.cancel)
        finally:
            relay.close()

    try:
        outcome = await job.run(work)
    except (ProfileError, ConfigError) as error:
        raise RequestFailed(str(error)) from None
    report = outcome.report
    report_path = out / "report.json"
    _show_profile(ls, args.uri, script, report, str(report_path), version)
    result: dict[str, Any] = {
        "reportPath": str(report_path),
        "peakBytes": report.peak_allocated,
        "device": report.device.type,
        "steps": outcome.completed_steps,
        "status": report.status,
    }
    if report.peak_reserved is not None:
        result["reservedBytes"] = report.peak_reserved
    if report.oom is not None:
        result["oom"] = explain_dict(report.oom.error)
    if report.error is not None:
        result["error"] = report.error  # the script's own exception, "ValueError: corrupt shard 17"
    if outcome.stopped:
        result["message"] = outcome.stopped
    if outcome.advice:
        result["advice"] = outcome.advice  # what to do about the OOM, as `oom-lsp profile` says it
    return result


def _top_line_diagnostics(
    ls: OomLanguageServer, report: Report, base: Path, message: Callable[[Any], str], data: dict[str, str]
) -> dict[str, list[types.Diagnostic]]:
    """Information diagnostics on a report's top lines, by file: at most TOP_LINES_SHOWN a file,
    none for a line holding under 1 % of the peak (noise on the source)."""
    noticeable = max(1, (report.peak_allocated or 0) // 100)
    by_uri: dict[str, list[types.Diagnostic]] = {}
    for usage in report.top_lines:
        target = uri_of_file(ls, usage.file, base)
        if target is None or usage.bytes < noticeable or len(by_uri.get(target, [])) >= TOP_LINES_SHOWN:
            continue
        by_uri.setdefault(target, []).append(
            types.Diagnostic(
                range=line_range(ls, target, usage.line),
                severity=types.DiagnosticSeverity.Information,
                source=SOURCE,
                message=message(usage),
                data=data,
            )
        )
    return by_uri


def _show_profile(
    ls: OomLanguageServer, uri: str, script: Path, report: Report, report_path: str, version: int | None
) -> None:
    """Information diagnostics on the top lines, an Error on the failing line
    of an OOM, and the memory status of the profiled file."""
    base = script.parent
    by_uri = {uri: []} | _top_line_diagnostics(
        ls,
        report,
        base,
        lambda usage: f"{format_bytes(usage.bytes)} live at peak (profile: {report.device.type}, "
        f"{usage.allocations} allocation(s) still held at the run's peak)",
        {"kind": "profile", "reportPath": report_path},
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
    from oom_lsp.usecases.explain import MAX_LOG_CHARS, explain, is_snapshot, read_log

    if (args.text is None) == (args.path is None):
        raise JsonRpcInvalidParams("give one of text or path")
    base = Path(ls.workspace.root_path) if ls.workspace.root_path else None
    if args.path is not None and await asyncio.to_thread(is_snapshot, Path(args.path)):
        return await _explain_snapshot(ls, Path(args.path), base)
    if args.path is not None:
        log = Path(args.path)
        try:
            text = await asyncio.to_thread(read_log, log)
        except OSError as error:
            raise JsonRpcInvalidParams(f"{log}: {error.strerror or error}") from None
        base = log.parent if base is None else base
    else:
        text = (args.text or "")[-MAX_LOG_CHARS:]
    # Off the event loop: a 20 MB log took 22.7 s, and every other request waited.
    ooms = (await asyncio.to_thread(explain, text)).ooms
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


async def _explain_snapshot(ls: OomLanguageServer, path: Path, base: Path | None) -> dict[str, Any]:
    """A memory snapshot (`oom-lsp explain FILE.pickle`): Information diagnostics on the lines
    that hold the bytes live at its peak, as a profile's; read as plain data (nothing in it runs)."""
    from oom_lsp.profiling.importers import ImportFormatError
    from oom_lsp.usecases.explain import explain_snapshot

    try:
        explanation = await asyncio.to_thread(explain_snapshot, path)
    except ImportFormatError as error:
        raise JsonRpcInvalidParams(str(error)) from None
    except OSError as error:
        raise JsonRpcInvalidParams(f"{path}: {error.strerror or error}") from None
    report = explanation.report
    base = path.parent if base is None else base
    by_uri = _top_line_diagnostics(
        ls,
        report,
        base,
        lambda usage: f"{format_bytes(usage.bytes)} live at the snapshot's peak of "
        f"{format_bytes(report.peak_allocated or 0)} ({usage.allocations} block(s) allocated here; "
        f"{path.name})",
        {"kind": "snapshot", "snapshot": str(path)},
    )
    for target, found in by_uri.items():
        store_result(
            ls,
            target,
            FileResult(kind="oom", report_path=None, version=document_version(ls, target), diagnostics=found),
        )
    return {
        "errors": [],
        "snapshot": {
            "peakAllocatedBytes": report.peak_allocated,
            "topLines": [usage.to_dict() for usage in report.top_lines],
            "heldBy": [group.to_dict() for group in explanation.held_by],
            "failedAllocation": explanation.failed.to_dict() if explanation.failed else None,
        },
    }


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
    return {"reportPath": latest_report(ls, args.uri, ("estimate", "profile", "oom"))}


def register(server: OomLanguageServer) -> None:
    server.command(PROFILE_COMMAND)(profile_command)
    server.command(EXPLAIN_COMMAND)(explain_command)
    server.command(SHOW_REPORT_COMMAND)(show_report_command)
