"""Diagnostics: pulled (`textDocument/diagnostic`) when the client can pull,
pushed (`textDocument/publishDiagnostics`) otherwise.

Pushing is debounced per document with an asyncio task (`debounce`, which
notebooks use too); a newer edit cancels the pending task, and a result whose
version has since changed is dropped (VS Code ignores the version of pushed
diagnostics, so the server must not send stale ones).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from lsprotocol import types

from oom_lsp.analysis import Finding, Severity
from oom_lsp.analysis.rule_links import rule_url
from oom_lsp.server.positions import PositionConverter
from oom_lsp.server.scheduling import ContentModified
from oom_lsp.server.server import Analysis, OomLanguageServer

logger = logging.getLogger(__name__)

SOURCE = "oom-lsp"
_SEVERITIES = {
    Severity.ERROR: types.DiagnosticSeverity.Error,
    Severity.WARNING: types.DiagnosticSeverity.Warning,
    Severity.INFO: types.DiagnosticSeverity.Information,
    Severity.HINT: types.DiagnosticSeverity.Hint,
}
# Findings about the suppression comments themselves: drawn faded.
_UNNECESSARY = {"OOM900"}


@dataclass
class Pending:
    """A server's debounced publications: the task per document (`ls.state(Pending)`)."""

    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)


def _owned(ls: OomLanguageServer, uri: str) -> bool:
    """Whether another feature publishes this document's diagnostics (a notebook's cells)."""
    return ls.hooks.cell_owner(ls, uri) is not None


def extra_diagnostics(ls: OomLanguageServer, uri: str) -> list[types.Diagnostic]:
    """The other features' diagnostics of the document (results, OOM reports)."""
    return ls.hooks.extra(ls, uri)


def diagnostic_message(finding: Finding, cell: int | None = None) -> str:
    """The finding's message, "(cell N)" in a notebook (the Problems panel lists a notebook's rows
    under the notebook, with lines counted in each cell), then, where a quick fix is known, its
    title as Ruff's server gives it: "help: ..." after a blank line. The message line stays what
    the CLI prints; the help is the `help:` line of `oom-lsp check --output-format full`."""
    message = finding.message if cell is None else f"{finding.message} (cell {cell})"
    return message if finding.fix is None else f"{message}\n\n{finding.fix.help}"


def to_diagnostic(
    finding: Finding, analysis: Analysis, converter: PositionConverter, cell: int | None = None
) -> types.Diagnostic:
    return types.Diagnostic(
        range=converter.range_to_lsp(finding.range),
        severity=_SEVERITIES[finding.severity],
        code=finding.code,
        # The same link as the CLI's output (docs/rules.md, `oom-lsp rule --all`).
        code_description=types.CodeDescription(href=rule_url(finding.code, finding.name)),
        source=SOURCE,
        message=diagnostic_message(finding, cell),
        tags=[types.DiagnosticTag.Unnecessary] if finding.code in _UNNECESSARY else None,
        # Code actions read the finding (with its fix) back from here.
        data={"finding": finding.to_dict(), "version": analysis.version},
    )


def to_diagnostics(analysis: Analysis, encoding: str) -> list[types.Diagnostic]:
    if analysis.skipped is not None:
        return [
            types.Diagnostic(
                range=types.Range(
                    start=types.Position(line=0, character=0), end=types.Position(line=0, character=0)
                ),
                severity=types.DiagnosticSeverity.Warning,
                source=SOURCE,
                message=f"oom-lsp {analysis.skipped}",
                data={"kind": "skipped"},
            )
        ]
    if not analysis.findings:
        return []
    converter = analysis.converter(encoding)
    return [to_diagnostic(finding, analysis, converter) for finding in analysis.findings]


def register(server: OomLanguageServer) -> None:
    server.hooks.republish = republish
    server.feature(types.TEXT_DOCUMENT_DID_OPEN)(on_did_open)
    server.feature(types.TEXT_DOCUMENT_DID_CHANGE)(on_did_change)
    server.feature(types.TEXT_DOCUMENT_DID_SAVE)(on_did_save)
    server.feature(types.TEXT_DOCUMENT_DID_CLOSE)(on_did_close)


def register_pull(server: OomLanguageServer) -> None:
    options = types.DiagnosticOptions(
        identifier=SOURCE, inter_file_dependencies=False, workspace_diagnostics=False
    )
    server.feature(types.TEXT_DOCUMENT_DIAGNOSTIC, options)(on_document_diagnostic)


# --- push ----------------------------------------------------------------------


def republish(ls: OomLanguageServer, uri: str) -> None:
    """Send an open document's diagnostics again (another feature's changed): pushed, or the
    client asked to pull them again when it can be."""
    if not ls.pull_diagnostics:
        schedule(ls, uri, 0)
    elif ls.client_supports("workspace.diagnostics.refresh_support"):
        ls.workspace_diagnostic_refresh(None)
    # A client that pulls without refresh (Neovim 0.11) sees them at its next pull.


def schedule(ls: OomLanguageServer, uri: str, delay: float) -> None:
    if ls.pull_diagnostics:
        return
    debounce(ls, uri, delay, _publish)


Publish = Callable[[OomLanguageServer, str], Awaitable[None]]


def debounce(ls: OomLanguageServer, uri: str, delay: float, publish: Publish) -> None:
    """`publish(ls, uri)` once the settings are known and `delay` has passed; a newer call for
    the same document cancels the one still pending. A file's diagnostics and a notebook's
    (server/notebooks.py) are published through here; a publication whose analysis a newer
    edit replaced (ContentModified) is dropped: that edit's own publication follows."""
    pending = ls.state(Pending).tasks
    previous = pending.pop(uri, None)
    if previous is not None:
        previous.cancel()
    task = asyncio.get_running_loop().create_task(_publish_after(ls, uri, delay, publish))
    pending[uri] = task
    task.add_done_callback(lambda done: _forget_task(pending, uri, done))


def cancel_pending(ls: OomLanguageServer, uri: str) -> None:
    """The document closed: its pending publication is not made."""
    pending = ls.state(Pending).tasks.pop(uri, None)
    if pending is not None:
        pending.cancel()


def _forget_task(pending: dict[str, asyncio.Task[None]], uri: str, task: asyncio.Task[None]) -> None:
    if pending.get(uri) is task:
        del pending[uri]
    if not task.cancelled() and task.exception() is not None:
        error = task.exception()
        logger.error("Checking %s failed", uri, exc_info=(type(error), error, error.__traceback__))


async def _publish_after(ls: OomLanguageServer, uri: str, delay: float, publish: Publish) -> None:
    await ls.settings_ready.wait()
    if delay:
        await asyncio.sleep(delay)
    try:
        await publish(ls, uri)
    except ContentModified:
        return  # replaced by a newer edit's analysis, which that edit's task publishes


async def _publish(ls: OomLanguageServer, uri: str) -> None:
    document = ls.open_document(uri)
    if document is None:
        return
    analysis = await ls.analysis_of(document)
    if not ls.is_current(analysis):
        return  # a newer edit has its own task
    ls.text_document_publish_diagnostics(
        types.PublishDiagnosticsParams(
            uri=uri,
            version=analysis.version,
            diagnostics=to_diagnostics(analysis, ls.position_encoding) + extra_diagnostics(ls, uri),
        )
    )


def refresh_all(ls: OomLanguageServer) -> None:
    """Check every open document again (settings or configuration changed)."""
    for owner in ls.hooks.cell_owners:
        owner.refresh(ls)
    if ls.pull_diagnostics:
        if ls.client_supports("workspace.diagnostics.refresh_support"):
            ls.workspace_diagnostic_refresh(None)
        return
    for document in ls.open_documents():
        if not _owned(ls, document.uri):
            schedule(ls, document.uri, 0)


def on_did_open(ls: OomLanguageServer, params: types.DidOpenTextDocumentParams) -> None:
    ls.adopt_document(params.text_document.uri)
    schedule(ls, params.text_document.uri, 0)


def on_did_change(ls: OomLanguageServer, params: types.DidChangeTextDocumentParams) -> None:
    schedule(ls, params.text_document.uri, ls.editor.debounce_seconds)


def on_did_save(ls: OomLanguageServer, params: types.DidSaveTextDocumentParams) -> None:
    # Saving a pyproject.toml opened in the editor changes the configuration.
    if params.text_document.uri.endswith(".toml"):
        ls.lint_settings.invalidate()
        ls.forget_analyses()
        refresh_all(ls)


def on_did_close(ls: OomLanguageServer, params: types.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    cancel_pending(ls, uri)
    ls.forget_document(uri)
    if not ls.pull_diagnostics:
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


# --- pull ----------------------------------------------------------------------


def _result_id(analysis: Analysis, extras: list[types.Diagnostic]) -> str:
    settings = analysis.settings.fingerprint() if analysis.settings is not None else "excluded"
    return f"{analysis.version}:{settings}:{hash(analysis.source)}:{hash(repr(extras))}"


async def on_document_diagnostic(
    ls: OomLanguageServer, params: types.DocumentDiagnosticParams
) -> types.DocumentDiagnosticReport:
    await ls.settings_ready.wait()
    document = ls.open_document(params.text_document.uri)
    if document is None or _owned(ls, document.uri):
        # A notebook cell's diagnostics are pushed (server/notebooks.py): none twice.
        return types.RelatedFullDocumentDiagnosticReport(items=[])
    # Edited while it was analysed: ContentModified (ranges of the older text would land in
    # the wrong places), and the client pulls again for the text it has now.
    analysis = ls.current_analysis(await ls.analysis_of(document))
    extras = extra_diagnostics(ls, params.text_document.uri)
    result_id = _result_id(analysis, extras)
    if params.previous_result_id == result_id:
        return types.RelatedUnchangedDocumentDiagnosticReport(result_id=result_id)
    return types.RelatedFullDocumentDiagnosticReport(
        items=to_diagnostics(analysis, ls.position_encoding) + extras, result_id=result_id
    )
