"""Notebooks in the editor: LSP 3.17 notebook document sync (cells of
language python), the cells analysed as one program (oom_lsp.notebooks), and
diagnostics, code actions and hover per cell URI.

- Every open/change/save of a notebook re-analyses all its code cells, so a
  change in one cell re-checks the cells that depend on it (a loss defined in
  cell 3 and accumulated in cell 5). Only the edited cell is prepared (masked,
  compiled) and parsed again (`IncrementalNotebook`); the rules run on the
  whole program.
- Diagnostics of cells are pushed, whether or not the client pulls (as Ruff's
  server does): a pull names one cell, and an edit elsewhere changes its
  findings without a change to it. A pull for a cell answers an empty report,
  so nothing is shown twice.
- The notebook's analysis goes through the server's analysis queue as a file's
  does (`ls.queued_analysis`, server/scheduling.py), and its publication through
  the same debounce (`diagnostics.debounce`): under sustained typing in a cell one
  analysis waits per notebook, a request on a cell edited under it is answered
  ContentModified, and a result for cells that changed since is not published.
- `ls.analysis_of(cell)` answers with the cell's part of the notebook's
  analysis, so hover (and anything else that asks) sees the same findings.
- Code actions on a cell: its quick fixes, "Ignore ... for this line",
  `source.fixAll.oom-lsp` for that cell, and `notebook.source.fixAll.oom-lsp`
  for every cell (VS Code's `notebook.codeActionsOnSave`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from lsprotocol import types
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument

from oom_lsp.analysis import Finding, LintSettings
from oom_lsp.gc_tuning import collect_before_analysis
from oom_lsp.notebooks.program import CellText, IncrementalNotebook, NotebookAnalysis, fix_cells
from oom_lsp.server import code_actions, diagnostics
from oom_lsp.server.hooks import CellOwner
from oom_lsp.server.positions import PositionConverter
from oom_lsp.server.server import Analysis, OomLanguageServer

logger = logging.getLogger(__name__)

CELL_FIX_ALL_KIND = code_actions.FIX_ALL_KIND
NOTEBOOK_FIX_ALL_KIND = "notebook." + code_actions.FIX_ALL_KIND
NOTEBOOK_FIX_ALL_TITLE = "oom-lsp: Fix all auto-fixable problems in the notebook"
_RESOLVER = "notebook-fix-all"

SYNC_OPTIONS = types.NotebookDocumentSyncOptions(
    notebook_selector=[
        types.NotebookDocumentFilterWithCells(
            notebook="*", cells=[types.NotebookCellLanguage(language="python")]
        )
    ],
    save=True,
)


@dataclass
class _State:
    key: tuple | None = None  # (cell URIs and versions, settings) of `analysis`
    analysis: NotebookAnalysis | None = None
    incremental: IncrementalNotebook | None = None
    published: dict[str, tuple[int, list[types.Diagnostic]]] | None = None  # cell URI -> (version, items)


@dataclass
class Notebooks:
    """A server's open notebooks: notebook URI -> its state (`ls.state(Notebooks)`)."""

    by_uri: dict[str, _State] = field(default_factory=dict)


def _states(ls: OomLanguageServer) -> dict[str, _State]:
    return ls.state(Notebooks).by_uri


def register(server: OomLanguageServer) -> None:
    """The cells go through the same handlers as files (analysis, diagnostics, hover, code
    actions) through one adapter: `ls.analysis_of(cell)` answers with the cell's part of its
    notebook's analysis, and the notebook owns its cells' publishing and fix-all."""
    server.feature(types.NOTEBOOK_DOCUMENT_DID_OPEN)(on_did_open)
    server.feature(types.NOTEBOOK_DOCUMENT_DID_CHANGE)(on_did_change)
    server.feature(types.NOTEBOOK_DOCUMENT_DID_SAVE)(on_did_save)
    server.feature(types.NOTEBOOK_DOCUMENT_DID_CLOSE)(on_did_close)
    server.cell_analysis = cell_analysis
    server.hooks.cell_owners.append(CellOwner(is_cell, refresh, on_cell_code_action))
    server.hooks.add_provider(_no_actions, {_RESOLVER: resolve_fix_all})


def notebook_of(ls: OomLanguageServer, uri: str) -> types.NotebookDocument | None:
    return ls.workspace.get_notebook_document(cell_uri=uri)


def is_cell(ls: OomLanguageServer, uri: str) -> bool:
    return notebook_of(ls, uri) is not None


# --- sync -------------------------------------------------------------------------------


def on_did_open(ls: OomLanguageServer, params: types.DidOpenNotebookDocumentParams) -> None:
    for cell in params.cell_text_documents:
        ls.adopt_document(cell.uri)
    _schedule(ls, params.notebook_document.uri, 0)


def on_did_change(ls: OomLanguageServer, params: types.DidChangeNotebookDocumentParams) -> None:
    uri = params.notebook_document.uri
    structure = params.change.cells.structure if params.change.cells else None
    if structure is not None:
        for opened in structure.did_open or []:
            ls.adopt_document(opened.uri)
        closed = [cell.uri for cell in structure.did_close or []]
        state = _states(ls).get(uri)
        for cell_uri in closed:
            if state is not None and state.published is not None:
                state.published.pop(cell_uri, None)
            ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=cell_uri, diagnostics=[]))
    _schedule(ls, uri, ls.editor.debounce_seconds)


def on_did_save(ls: OomLanguageServer, params: types.DidSaveNotebookDocumentParams) -> None:
    _schedule(ls, params.notebook_document.uri, 0)


def on_did_close(ls: OomLanguageServer, params: types.DidCloseNotebookDocumentParams) -> None:
    uri = params.notebook_document.uri
    _states(ls).pop(uri, None)
    diagnostics.cancel_pending(ls, uri)
    ls.scheduling.analyses.forget(uri)
    for cell in params.cell_text_documents:
        ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=cell.uri, diagnostics=[]))


def refresh(ls: OomLanguageServer) -> None:
    """Settings or configuration changed: check every open notebook again."""
    for uri, state in _states(ls).items():
        state.key = None
        _schedule(ls, uri, 0)


def _schedule(ls: OomLanguageServer, uri: str, delay: float) -> None:
    """The notebook's diagnostics, debounced as a file's are (diagnostics.debounce): pushed
    whether or not the client pulls (see the module docstring)."""
    _states(ls).setdefault(uri, _State())
    diagnostics.debounce(ls, uri, delay, _publish)


async def _publish(ls: OomLanguageServer, uri: str) -> None:
    notebook = ls.workspace.get_notebook_document(notebook_uri=uri)
    if notebook is None:
        return
    analysis, cells = await _analysis(ls, notebook)
    state = _states(ls).get(uri)
    if analysis is None or state is None or _cells_key(ls, notebook) != state.key:
        return  # a newer change has its own task (or the notebook closed)
    published = state.published or {}
    for cell in cells:
        document = ls.open_document(cell.key)
        if document is None:
            continue
        items = _diagnostics(ls, document, analysis.findings.get(cell.key, []))
        # An edited cell is always answered (its new version is checked, even with the same
        # findings); another cell only when the edit changed its findings.
        if published.get(cell.key) != (document.version, items):
            ls.text_document_publish_diagnostics(
                types.PublishDiagnosticsParams(uri=document.uri, version=document.version, diagnostics=items)
            )
            published[cell.key] = (document.version, items)
    state.published = published


# --- analysis ---------------------------------------------------------------------------


def _code_cells(ls: OomLanguageServer, notebook: types.NotebookDocument) -> list[CellText]:
    cells = []
    for number, cell in enumerate(notebook.cells, start=1):
        if cell.kind != types.NotebookCellKind.Code:
            continue
        document = ls.open_document(cell.document)
        if document is None or (document.language_id or "python").lower() != "python":
            continue
        cells.append(CellText(document.uri, document.source, number))
    return cells


def _settings(ls: OomLanguageServer, notebook: types.NotebookDocument) -> LintSettings | None:
    return ls.settings_for_uri(notebook.uri)


def _cells_key(ls: OomLanguageServer, notebook: types.NotebookDocument) -> tuple:
    versions = []
    for cell in notebook.cells:
        document = ls.open_document(cell.document)
        versions.append((cell.document, cell.kind, document.version if document else None))
    settings = _settings(ls, notebook)
    return tuple(versions), settings.fingerprint() if settings is not None else None


async def _analysis(
    ls: OomLanguageServer, notebook: types.NotebookDocument
) -> tuple[NotebookAnalysis | None, list[CellText]]:
    """The notebook's analysis for its cells' current texts, memoized; None when
    the configuration excludes the notebook."""
    state = _states(ls).setdefault(notebook.uri, _State())
    cells = _code_cells(ls, notebook)
    key = _cells_key(ls, notebook)
    if state.key == key and state.analysis is not None:
        return state.analysis, cells
    settings = _settings(ls, notebook)
    if settings is None:
        state.key, state.analysis = key, None
        return None, cells
    if state.incremental is None:
        state.incremental = IncrementalNotebook()
    incremental = state.incremental
    path = to_fs_path(notebook.uri) or notebook.uri
    # Through the server's queue, as a file's analysis (server/scheduling.py): one waiting
    # analysis per notebook, shared by the requests and the publication asking for the same
    # cells, replaced (ContentModified to its callers) when a cell changes before it ran.
    analysis = await ls.queued_analysis(
        notebook.uri, key, lambda: _analyze_on_worker(notebook.uri, incremental, cells, settings, path)
    )
    if _cells_key(ls, notebook) == key and _states(ls).get(notebook.uri) is state:
        state.key, state.analysis = key, analysis
    return analysis, cells


def _analyze_on_worker(
    uri: str, incremental: IncrementalNotebook, cells: list[CellText], settings: LintSettings, path: str
) -> NotebookAnalysis:
    collect_before_analysis()
    started = time.perf_counter()
    analysis = incremental.analyze(cells, settings, path)
    # One line per analysis run, as a file's (tests/server/test_notebook_load.py counts them).
    logger.debug(
        "Analysed %s (%d cells): %d findings in %.0f ms",
        uri,
        len(cells),
        sum(len(found) for found in analysis.findings.values()),
        (time.perf_counter() - started) * 1000,
    )
    return analysis


async def cell_analysis(ls: OomLanguageServer, document: TextDocument) -> Analysis:
    """`ls.analysis_of` for a cell: its part of the notebook's findings, labelled with the
    cell's version it was asked for (a request's handler compares it with the current one)."""
    uri, version, source = document.uri, document.version, document.source
    notebook = notebook_of(ls, uri)
    settings = _settings(ls, notebook) if notebook is not None else None
    findings: list[Finding] = []
    if notebook is not None and settings is not None:
        analysis, _ = await _analysis(ls, notebook)
        if analysis is not None:
            findings = analysis.findings.get(uri, [])
    return Analysis(uri, version, source, settings, findings)


def _diagnostics(
    ls: OomLanguageServer, document: TextDocument, findings: list[Finding]
) -> list[types.Diagnostic]:
    analysis = Analysis(document.uri, document.version, document.source, None, findings)
    converter = PositionConverter(document.source, ls.position_encoding)
    # The Problems panel lists a notebook's rows under the notebook, with lines counted in each
    # cell: the row names its cell as the CLI does ("cell 4", markdown cells counted).
    number = _cell_number(ls, document.uri)
    return [diagnostics.to_diagnostic(finding, analysis, converter, number) for finding in findings]


def _cell_number(ls: OomLanguageServer, uri: str) -> int | None:
    notebook = notebook_of(ls, uri)
    if notebook is None:
        return None
    for index, cell in enumerate(notebook.cells):
        if cell.document == uri:
            return index + 1
    return None


# --- code actions -----------------------------------------------------------------------


async def _no_actions(ls: OomLanguageServer, params: Any, document: TextDocument) -> list[types.CodeAction]:
    return []  # notebooks only add a resolver (fix-all); their actions come from on_cell_code_action


async def on_cell_code_action(
    ls: OomLanguageServer, params: types.CodeActionParams
) -> list[types.CodeAction] | None:
    document = ls.open_document(params.text_document.uri)
    notebook = notebook_of(ls, params.text_document.uri)
    if document is None or notebook is None:
        return None
    only = params.context.only
    # A cell's quick fixes and "Ignore" actions are a file's (the same handler).
    actions, has_safe_fix = code_actions.finding_actions(ls, params, document)
    if only is not None:
        # Asked for by kind (VS Code's codeActionsOnSave / notebook.codeActionsOnSave): the edit comes now.
        fix_all = None
        if code_actions.kind_wanted(only, NOTEBOOK_FIX_ALL_KIND):
            fix_all = await _fix_all(ls, notebook, None)
        elif code_actions.kind_wanted(only, CELL_FIX_ALL_KIND):
            fix_all = await _fix_all(ls, notebook, document.uri)
        if fix_all is not None:
            actions.append(fix_all)
    if only is None and has_safe_fix:
        actions.append(
            types.CodeAction(
                title=code_actions.FIX_ALL_TITLE,
                kind=CELL_FIX_ALL_KIND,
                data={"resolver": _RESOLVER, "uri": document.uri, "version": document.version},
            )
        )
    return actions


async def resolve_fix_all(ls: OomLanguageServer, action: types.CodeAction) -> types.CodeAction:
    data: Any = action.data
    document = ls.open_document(str(data.get("uri")))
    notebook = notebook_of(ls, str(data.get("uri")))
    if document is None or notebook is None or document.version != data.get("version"):
        return action
    resolved = await _fix_all(ls, notebook, document.uri)
    if resolved is not None:
        action.edit = resolved.edit
    return action


async def _fix_all(
    ls: OomLanguageServer, notebook: types.NotebookDocument, cell_uri: str | None
) -> types.CodeAction | None:
    """Every safe fix of the notebook (cell_uri None) or of one cell, one edit per changed cell."""
    await ls.settings_ready.wait()
    settings = _settings(ls, notebook)
    if settings is None:
        return None
    cells = _code_cells(ls, notebook)
    versions = {cell.key: ls.open_document(cell.key).version for cell in cells}
    only: set[Hashable] | None = {cell_uri} if cell_uri is not None else None
    path = to_fs_path(notebook.uri) or notebook.uri
    loop = asyncio.get_running_loop()
    result = await loop.run_in_executor(
        ls.analysis_executor, lambda: fix_cells(cells, settings, path=path, only_keys=only)
    )
    if result.applied == 0:
        return None
    changes = []
    for cell in cells:
        new = result.sources.get(cell.key)
        document = ls.open_document(cell.key)
        if new is None or document is None:
            continue
        if document.version != versions[cell.key]:
            return None  # edited meanwhile
        converter = PositionConverter(cell.source, ls.position_encoding)
        edit = code_actions.minimal_edit(cell.source, new, converter)
        changes.append(
            types.TextDocumentEdit(
                text_document=types.OptionalVersionedTextDocumentIdentifier(
                    uri=document.uri, version=document.version
                ),
                edits=[edit],
            )
        )
    if not changes:
        return None
    if ls.client_supports("workspace.workspace_edit.document_changes"):
        edit = types.WorkspaceEdit(document_changes=changes)
    else:
        edit = types.WorkspaceEdit(changes={change.text_document.uri: change.edits for change in changes})
    whole = cell_uri is None
    return types.CodeAction(
        title=NOTEBOOK_FIX_ALL_TITLE if whole else code_actions.FIX_ALL_TITLE,
        kind=NOTEBOOK_FIX_ALL_KIND if whole else CELL_FIX_ALL_KIND,
        edit=edit,
    )
