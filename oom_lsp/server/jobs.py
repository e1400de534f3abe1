"""What every long command of the editor shares (the estimate, the what-if, the profile, the
explanation of an OOM, the AI fix's validation): running a subprocess job with work-done
progress and cancellation, the per-file results with their diagnostics and the
`oomLsp/memoryStatus` notification, the interpreter that runs the user's code and the
project's `.oom_lsp/` folder.

Results belong to the text they were measured on. A result remembers the
document's version when the run started (None for a file that was not
open, adopted when it opens) and is dropped at the first look after the
document changed or closed: its diagnostics go, and the file's memory status
is reset (`peakBytes: null`).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams, JsonRpcRequestCancelled
from pygls.uris import to_fs_path

from oom_lsp.server.protocol import RequestFailed
from oom_lsp.server.server import OomLanguageServer

logger = logging.getLogger(__name__)

MEMORY_STATUS = "oomLsp/memoryStatus"
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


@dataclass
class Results:
    """A server's per-file results (`ls.state(Results)`)."""

    # uri -> kind -> result
    current: dict[str, dict[str, FileResult]] = field(default_factory=dict)
    # uri -> kind -> the latest report, kept after an edit (showReport, validateFix compare with it).
    last_reports: dict[str, dict[str, tuple[float, str]]] = field(default_factory=dict)
    # URIs whose results were published while the file was closed.
    pushed_closed: set[str] = field(default_factory=set)
    # (kind, script) of the jobs running: a second run of the same kind on the same script would
    # write over the first one's output folder.
    running: set[tuple[str, Path]] = field(default_factory=set)


def current_results(ls: OomLanguageServer, uri: str) -> dict[str, FileResult]:
    """The file's results that still hold for its text; stale ones are
    dropped here (and the status bar reset) the first time they are seen."""
    store = ls.state(Results).current
    results = store.get(uri)
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
        del store[uri]
    return dict(results)


def _supports_hint_refresh(ls: OomLanguageServer) -> bool:
    return ls.client_supports("workspace.inlay_hint.refresh_support")


def store_result(ls: OomLanguageServer, uri: str, result: FileResult) -> None:
    """Keep the result and show its diagnostics (and nothing of a previous
    result of the same kind)."""
    state = ls.state(Results)
    state.current.setdefault(uri, {})[result.kind] = result
    if result.report_path:
        state.last_reports.setdefault(uri, {})[result.kind] = (result.when, result.report_path)
    republish(ls, uri)


def latest_report(
    ls: OomLanguageServer, uri: str, kinds: tuple[str, ...] = ("estimate", "profile")
) -> str | None:
    """The file's most recent report of those kinds, even if the file changed
    since (oom-lsp.validateFix compares a fix with the measurement before it)."""
    reports = [
        report for kind, report in ls.state(Results).last_reports.get(uri, {}).items() if kind in kinds
    ]
    return max(reports)[1] if reports else None


def result_diagnostics(ls: OomLanguageServer, uri: str) -> list[types.Diagnostic]:
    """The results' diagnostics: a source of the diagnostics feature (server/features.py adds it)."""
    pushed_closed = ls.state(Results).pushed_closed
    if uri in pushed_closed and ls.open_document(uri) is not None:
        # Published while the file was closed; now they come with its analysis.
        pushed_closed.discard(uri)
        if ls.pull_diagnostics:
            ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))
    return [diagnostic for result in current_results(ls, uri).values() for diagnostic in result.diagnostics]


def republish(ls: OomLanguageServer, uri: str) -> None:
    """Send the file's diagnostics again: with its analysis when it is open,
    alone when it is not (an OOM in a file the user has not opened)."""
    if ls.open_document(uri) is None:
        results = current_results(ls, uri)
        ls.state(Results).pushed_closed.add(uri)
        ls.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(
                uri=uri, diagnostics=[d for result in results.values() for d in result.diagnostics]
            )
        )
        return
    ls.forget_analyses(uri)
    if ls.hooks.republish is not None:
        ls.hooks.republish(ls, uri)


def send_memory_status(ls: OomLanguageServer, status: dict[str, Any]) -> None:
    ls.protocol.notify(MEMORY_STATUS, status)


# --- jobs: progress and cancellation -------------------------------------------------


class Job:
    """One long command: its cancel event (set by `$/cancelRequest`, by the
    progress' cancel button, or when the server cancels the task) and its
    work-done progress, reported from any thread."""

    def __init__(self, ls: OomLanguageServer, title: str, kind: str, script: Path) -> None:
        self.key = (kind, script.resolve())
        if self.key in ls.state(Results).running:
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
        running = self.ls.state(Results).running
        running.add(self.key)
        self.ls.job_cancels.add(self.cancel)
        try:
            return await self._run(work)
        finally:
            running.discard(self.key)
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


def results_folder(ls: OomLanguageServer, script: Path, kind: str) -> Path:
    """`.oom_lsp/<kind>/` under the file's project root."""
    root = ls.lint_settings.project_config(script).root
    return Path(root) / RESULTS_FOLDER / kind


def document_version(ls: OomLanguageServer, uri: str) -> int | None:
    document = ls.open_document(uri)
    return document.version if document is not None else None


def require_trusted_workspace(ls: OomLanguageServer, what: str) -> None:
    """RequestFailed when the editor has not trusted the workspace (VS Code's restricted
    mode): `what` would run its code."""
    if not ls.editor.workspace_trusted:
        raise RequestFailed(
            f"{what} runs this workspace's code, and the workspace is not trusted: trust it "
            "(VS Code: Manage Workspace Trust) to run it"
        )


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
