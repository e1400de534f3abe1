"""The language server's core: the settings, the readiness gate, the analysis of open
documents (memoized per version) and the per-server state of the features.

The features (server/features.py lists and registers them) add their handlers to one
`OomLanguageServer`, what they offer each other to its `hooks` (server/hooks.py), and keep
what they remember in `ls.state(TheirState)`: nothing lives in a module global, so two
servers in one process share nothing. This module imports no feature.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import gc
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import unquote

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument

from oom_lsp import __version__
from oom_lsp.analysis import Finding, LintSettings
from oom_lsp.checker import analyze_text, too_large
from oom_lsp.edits import split_lines
from oom_lsp.gc_tuning import collect_before_analysis, tune_for_analysis
from oom_lsp.server import settings as editor_settings
from oom_lsp.server import transport
from oom_lsp.server.hooks import FeatureHooks
from oom_lsp.server.logs import LogSetup
from oom_lsp.server.positions import PositionConverter
from oom_lsp.server.protocol import OomProtocol, make_converter
from oom_lsp.server.scheduling import ContentModified, Scheduling, Superseded

if TYPE_CHECKING:
    from oom_lsp.analysis.incremental import IncrementalParser

logger = logging.getLogger(__name__)
State = TypeVar("State")
Result = TypeVar("Result")

CONFIGURATION_TIMEOUT_S = 5.0
# ~100 KB of source: a few seconds of analysis and more (a 1 MiB file takes ~45 s on a
# loaded 2-core machine); such documents are analysed by a worker of their own.
LARGE_SOURCE_CHARS = 100_000
WATCHED_CONFIG_GLOBS = [f"**/{name}" for name in editor_settings.CONFIG_FILE_NAMES]


@dataclass(frozen=True)
class Analysis:
    """The findings of one version of one document."""

    uri: str
    version: int | None
    source: str
    settings: LintSettings | None  # None: the file is excluded
    findings: list[Finding]
    skipped: str | None = None  # why the text was not analysed (over max-file-size)

    def converter(self, encoding: str) -> PositionConverter:
        return PositionConverter(self.source, encoding)


class LspLinesTextDocument(TextDocument):
    """pygls' document with the LSP's lines: only `\\n`, `\\r\\n` and `\\r` end
    a line. pygls splits with `str.splitlines`, which also breaks at form
    feeds, `\\x1c`-`\\x1e`, `\\x85`, `\\u2028`...; an incremental edit after
    such a character would land on the wrong line and the server's copy of
    the document would silently differ from the editor's."""

    @property
    def lines(self) -> Sequence[str]:
        return tuple(split_lines(self.source, keepends=True))


class OomLanguageServer(LanguageServer):
    def __init__(
        self, log_file: str | None = None, notebook_sync: types.NotebookDocumentSyncOptions | None = None
    ) -> None:
        super().__init__(
            name="oom-lsp",
            version=__version__,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
            protocol_cls=OomProtocol,
            converter_factory=make_converter,
            notebook_document_sync=notebook_sync,
        )
        self.protocol: OomProtocol
        # What the features add to each other, and what each keeps (`state`).
        self.hooks = FeatureHooks()
        self._states: dict[type, Any] = {}
        # The cancel events of the jobs running (profiles, estimates, validations):
        # set at shutdown and exit, so no run outlives the session.
        self.job_cancels: set[threading.Event] = set()
        self.logs = LogSetup(self, log_file)
        self.editor = editor_settings.EditorSettings()
        self.lint_settings = editor_settings.LintSettingsSource(report_error=self.show_error)
        # Set once the settings are known: a didOpen may arrive before the
        # client answers workspace/configuration.
        self.settings_ready = asyncio.Event()
        self.pull_diagnostics = False
        # One worker: analyses queue instead of competing for the GIL, and a
        # request cancelled before its turn costs nothing.
        self.analysis_executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="oom-analysis"
        )
        self.large_analysis_executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="oom-analysis-large"
        )
        self._analyses: dict[str, Analysis] = {}
        # One pending analysis per document; requests answered ContentModified when their
        # document changes (server/scheduling.py).
        self.scheduling = Scheduling()
        # Per open document: keeps the last version's parsed statements, so an
        # edit re-parses only the statements it touched.
        self._parsers: dict[str, IncrementalParser] = {}
        # OOM101's threshold per URI: the largest batch an estimate found to fit.
        self.max_batch_by_uri: dict[str, int] = {}
        # The analysis of a notebook cell, set by `notebooks`: the cell's part of its
        # notebook's analysis (a cell alone is not the program it runs in).
        self.cell_analysis: Callable[[OomLanguageServer, TextDocument], Awaitable[Analysis]] | None = None

    def state(self, kind: type[State]) -> State:
        """This server's instance of a feature's state class (made on first use, with no arguments)."""
        found = self._states.get(kind)
        if found is None:
            found = self._states[kind] = kind()
        return found

    # --- transport and lifetime -----------------------------------------------

    def start_io(self, stdin: Any = None, stdout: Any = None) -> int:  # type: ignore[override]
        """Serve on stdio until `exit` (or the client closes stdin); the exit code."""
        return transport.serve_stdio(self, stdin, stdout)

    def start_tcp(self, host: str, port: int) -> int:  # type: ignore[override]
        return transport.serve_tcp(self, host, port)

    def stop_jobs(self) -> None:
        for cancel in list(self.job_cancels):
            cancel.set()

    # --- client capabilities -------------------------------------------------

    @property
    def position_encoding(self) -> str:
        encoding = self.workspace.position_encoding or types.PositionEncodingKind.Utf16
        return str(getattr(encoding, "value", encoding))

    def client_supports(self, dotted: str) -> bool:
        value: Any = self.client_capabilities
        for part in dotted.split("."):
            value = getattr(value, part, None)
            if value is None:
                return False
        return bool(value)

    # --- settings ----------------------------------------------------------------

    def apply_editor_settings(self, raw: dict[str, Any]) -> None:
        self.editor = editor_settings.parse_editor_settings(raw)
        self.logs.configure(self.editor.log_level, self.editor.log_file)
        self.lint_settings.update_editor_settings(self.editor)
        for problem in self.editor.problems:
            self.show_error(problem)
        self.forget_analyses()

    async def fetch_configuration(self) -> dict[str, Any] | None:
        """The `oomLsp` section from workspace/configuration, or None when the
        client cannot answer it (or does not within the timeout)."""
        if not self.client_supports("workspace.configuration"):
            return None
        request = types.ConfigurationParams(items=[types.ConfigurationItem(section=editor_settings.SECTION)])
        try:
            answer = await asyncio.wait_for(
                self.workspace_configuration_async(request), CONFIGURATION_TIMEOUT_S
            )
        except asyncio.TimeoutError:
            logger.warning(
                "The client did not answer workspace/configuration within %.0f s", CONFIGURATION_TIMEOUT_S
            )
            return None
        if not answer or not isinstance(answer[0], dict):
            return None  # the user configured nothing under oomLsp
        return editor_settings.unwrap(answer[0])

    def show_error(self, message: str) -> None:
        logger.error("%s", message)
        self.window_show_message(
            types.ShowMessageParams(type=types.MessageType.Error, message=f"oom-lsp: {message}")
        )

    # --- analysis ------------------------------------------------------------------

    def open_document(self, uri: str) -> TextDocument | None:
        """The document if the client opened it. `workspace.get_text_document`
        would read a file never opened from disk, which a request for an
        unknown document must not do. (pygls keys documents by unquoted URI.)"""
        return self.workspace.text_documents.get(unquote(uri))

    def adopt_document(self, uri: str) -> None:
        """Give a just-opened document the LSP's line splitting (pygls
        creates the instance; its class is the one thing to change)."""
        document = self.open_document(uri)
        if document is not None and type(document) is TextDocument:
            document.__class__ = LspLinesTextDocument

    def open_documents(self) -> list[TextDocument]:
        return list(self.workspace.text_documents.values())

    def forget_analyses(self, uri: str | None = None) -> None:
        if uri is None:
            self._analyses.clear()
        else:
            self._analyses.pop(uri, None)

    def forget_document(self, uri: str) -> None:
        self.forget_analyses(uri)
        self.scheduling.analyses.forget(uri)
        self._parsers.pop(uri, None)

    def settings_for_uri(self, uri: str) -> LintSettings | None:
        """None when the project's configuration excludes the file."""
        path = to_fs_path(uri)
        settings = self.lint_settings.for_path(Path(path) if path else None)
        fitting = self.max_batch_by_uri.get(uri)
        if settings is None or fitting is None:
            return settings
        return dataclasses.replace(settings, max_batch_size=fitting)

    async def analysis_of(self, document: TextDocument) -> Analysis:
        """The findings of the document's current text, computed off the event
        loop and memoized per (version, settings). Callers asking for the same text
        share one analysis; one for a newer text replaces the one still waiting
        (server/scheduling.py), whose callers get ContentModified."""
        uri, version, source = document.uri, document.version, document.source
        if self.cell_analysis is not None and self.workspace.get_notebook_document(cell_uri=uri) is not None:
            return await self.cell_analysis(self, document)
        settings = self.settings_for_uri(uri)
        cached = self._analyses.get(uri)
        if (
            cached is not None
            and cached.version == version
            and cached.source == source
            and cached.settings == settings
        ):
            return cached
        skipped = self._too_large(uri, source) if settings is not None else None
        if settings is None or skipped is not None:
            findings: list[Finding] = []
        else:
            path = to_fs_path(uri) or uri
            # A big file has a worker of its own: the others' analyses do not queue behind it.
            executor = (
                self.large_analysis_executor if len(source) > LARGE_SOURCE_CHARS else self.analysis_executor
            )
            findings = await self.queued_analysis(
                uri,
                (version, source, settings),
                lambda: self._analyze_on_worker(uri, version, source, settings, path),
                executor,
            )
        analysis = Analysis(uri, version, source, settings, findings, skipped)
        if self.open_document(uri) is not None:
            if self.is_current(analysis):
                self._analyses[uri] = analysis  # (one older than the kept one would replace it)
        else:
            self._parsers.pop(uri, None)  # closed while it was analysed
        return analysis

    async def queued_analysis(
        self,
        uri: str,
        key: Hashable,
        compute: Callable[[], Result],
        executor: concurrent.futures.Executor | None = None,
    ) -> Result:
        """`compute()` (the analysis of the document `uri` as it is now, `key`) on the analysis
        worker, through the server's queue (server/scheduling.py): one waiting analysis per
        document, shared by the callers asking for the same `key`, replaced by a newer one, whose
        callers then get ContentModified. A file's analysis and a notebook's go through here."""
        pending = self.scheduling.analyses.submit(uri, key, executor or self.analysis_executor, compute)
        try:
            return await asyncio.shield(pending)
        except Superseded:
            raise ContentModified(f"{uri} changed before this version of it was analysed") from None

    def current_analysis(self, analysis: Analysis) -> Analysis:
        """`analysis` if the document has not changed since, else ContentModified (the
        request's answer would be for a text the client no longer has)."""
        if not self.is_current(analysis):
            raise ContentModified(f"{analysis.uri} changed while it was analysed")
        return analysis

    def _analyze_on_worker(
        self, uri: str, version: int | None, source: str, settings: LintSettings, path: str
    ) -> list[Finding]:
        # Imported here, on the worker: libcst may still be loading there (warm_up_analysis), and
        # the event loop must not wait for that import.
        from oom_lsp.analysis.incremental import IncrementalParser

        parser = self._parsers.setdefault(uri, IncrementalParser())
        collect_before_analysis()
        started = time.perf_counter()
        findings = analyze_text(source, settings, path, parser.parse)
        # One line per analysis run (tests/server/test_load.py counts them).
        logger.debug(
            "Analysed %s v%s: %d findings in %.0f ms",
            uri,
            version,
            len(findings),
            (time.perf_counter() - started) * 1000,
        )
        return findings

    def _too_large(self, uri: str, source: str) -> str | None:
        path = to_fs_path(uri)
        limit = self.lint_settings.project_config(Path(path) if path else None).max_file_size
        if 4 * len(source) <= limit:  # no UTF-8 character takes more than 4 bytes
            return None
        size = len(source) if len(source) > limit else len(source.encode("utf-8", "surrogatepass"))
        return too_large(size, limit)

    def is_current(self, analysis: Analysis) -> bool:
        document = self.open_document(analysis.uri)
        return document is not None and document.version == analysis.version


def warm_up_analysis() -> None:
    """Import what the first analysis needs (libcst, the rules) and run it once on a few lines:
    started on the analysis worker at start-up, so that this third of the server's start-up
    CPU runs while the client and the server shake hands instead of before `initialize` is
    answered; the first analysis queues behind it. The collector, off during start-up (what is
    allocated then lives as long as the process), is tuned and turned back on at its end."""
    try:
        from oom_lsp.analysis import analyze, default_settings
        from oom_lsp.analysis.incremental import IncrementalParser

        text = "import torch\nfor x in loader:\n    loss = model(x.cuda()).sum()\n    loss.backward()\n"
        analyze(text, default_settings(), "warm-up.py", parse=IncrementalParser().parse)
    finally:
        tune_for_analysis()
        gc.enable()
