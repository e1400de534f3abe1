"""Code actions: the quick fix of a diagnostic, "Ignore OOMxxx for this line"
and `source.fixAll.oom-lsp` (safe fixes only, usable from
`editor.codeActionsOnSave`).

Quick fixes come from the finding carried in the diagnostic's `data`, so no
analysis runs; a diagnostic computed for an older version of the document is
skipped (its edits would land in the wrong place). Edits are versioned
`TextDocumentEdit`s where the client supports `documentChanges`, so a client
rejects them if the document changed in between. Fix-all offered in the
light-bulb list comes without its edit, computed on `codeAction/resolve`.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import Any

from lsprotocol import types
from pygls.workspace import TextDocument

from oom_lsp.analysis import Finding
from oom_lsp.edits import TextEdit
from oom_lsp.fixes.suppress import ignore_for_line
from oom_lsp.server.diagnostics import SOURCE
from oom_lsp.server.positions import PositionConverter
from oom_lsp.server.server import OomLanguageServer

logger = logging.getLogger(__name__)

FIX_ALL_KIND = "source.fixAll.oom-lsp"
FIX_ALL_TITLE = "oom-lsp: Fix all auto-fixable problems"
# A syntax error cannot be suppressed: the file is not checked at all.
_UNSUPPRESSIBLE = {"OOM000"}

# Other features add actions (AI fixes, OOM reports, instrumentation, the estimate's) with
# `server.hooks.add_provider`, words to a fix's title with `server.hooks.title_notes` (in the
# codeAction answer itself: VS Code draws the title it lists and does not redraw one changed by
# codeAction/resolve), and answer for their own documents as `hooks.cell_owners` (notebook cells).


def plain_title(title: str) -> str:
    """A fix's title as a menu shows it: editors draw code-action titles as plain text, so the
    Markdown backticks of the rule's title (`retain_graph=True`) would show literally."""
    return title.replace("`", "")


def _noted(ls: OomLanguageServer, document: TextDocument, title: str, finding: Finding | None) -> str:
    for note in ls.hooks.title_notes:
        words = note(ls, document, finding)
        if words:
            return f"{title}, {words}"
    return title


def register(server: OomLanguageServer) -> None:
    options = types.CodeActionOptions(
        code_action_kinds=[
            types.CodeActionKind.QuickFix,
            types.CodeActionKind.RefactorRewrite,
            FIX_ALL_KIND,
            # VS Code asks only providers that list it (notebook.codeActionsOnSave): server/notebooks.py.
            "notebook." + FIX_ALL_KIND,
        ],
        resolve_provider=True,
    )
    server.feature(types.TEXT_DOCUMENT_CODE_ACTION, options)(on_code_action)
    server.feature(types.CODE_ACTION_RESOLVE)(on_code_action_resolve)


def kind_wanted(only: list[str] | None, kind: str) -> bool:
    """Whether a code action of `kind` answers a request limited to `only`
    (LSP: a requested kind also admits its sub-kinds)."""
    return only is None or any(kind == entry or kind.startswith(entry + ".") for entry in only)


def _finding_of(diagnostic: types.Diagnostic, document: TextDocument) -> Finding | None:
    """The finding a current oom-lsp diagnostic carries, else None."""
    data: Any = diagnostic.data
    if diagnostic.source != SOURCE or not isinstance(data, dict) or data.get("version") != document.version:
        return None
    try:
        return Finding.from_dict(data["finding"])
    except (KeyError, TypeError, ValueError):
        logger.warning("Ignoring a diagnostic whose data is not an oom-lsp finding: %r", data)
        return None


def workspace_edit(
    ls: OomLanguageServer, document: TextDocument, edits: list[types.TextEdit]
) -> types.WorkspaceEdit:
    if ls.client_supports("workspace.workspace_edit.document_changes"):
        identifier = types.OptionalVersionedTextDocumentIdentifier(uri=document.uri, version=document.version)
        return types.WorkspaceEdit(
            document_changes=[types.TextDocumentEdit(text_document=identifier, edits=edits)]
        )
    return types.WorkspaceEdit(changes={document.uri: edits})


def _lsp_edits(
    edits: tuple[TextEdit, ...] | list[TextEdit], converter: PositionConverter
) -> list[types.TextEdit]:
    return [
        types.TextEdit(range=converter.range_to_lsp(edit.range), new_text=edit.new_text) for edit in edits
    ]


def finding_actions(
    ls: OomLanguageServer, params: types.CodeActionParams, document: TextDocument
) -> tuple[list[types.CodeAction], bool]:
    """The quick fix and "Ignore OOMxxx for this line" of each current finding in the context,
    for a file or a notebook's cell alike, and whether one of them has a safe fix."""
    only = params.context.only
    source = document.source
    converter = PositionConverter(source, ls.position_encoding)
    actions: list[types.CodeAction] = []
    ignored: set[tuple[str, int]] = set()
    has_safe_fix = False
    for diagnostic in params.context.diagnostics:
        finding = _finding_of(diagnostic, document)
        if finding is None:
            continue
        has_safe_fix = has_safe_fix or (finding.fix is not None and finding.fix.is_safe)
        if not kind_wanted(only, types.CodeActionKind.QuickFix):
            continue
        if finding.fix is not None:
            actions.append(
                types.CodeAction(
                    title=_noted(
                        ls, document, f"oom-lsp ({finding.code}): {plain_title(finding.fix.title)}", finding
                    ),
                    kind=types.CodeActionKind.QuickFix,
                    diagnostics=[diagnostic],
                    is_preferred=finding.fix.is_safe,
                    edit=workspace_edit(ls, document, _lsp_edits(finding.fix.edits, converter)),
                )
            )
        if finding.code not in _UNSUPPRESSIBLE and (finding.code, finding.line) not in ignored:
            ignored.add((finding.code, finding.line))
            edit = ignore_for_line(source, finding.line, finding.code, finding.statement_line)
            if edit is not None:
                actions.append(
                    types.CodeAction(
                        title=f"oom-lsp ({finding.code}): Ignore {finding.code} for this line",
                        kind=types.CodeActionKind.QuickFix,
                        diagnostics=[diagnostic],
                        edit=workspace_edit(ls, document, _lsp_edits([edit], converter)),
                    )
                )
    return actions, has_safe_fix


async def on_code_action(
    ls: OomLanguageServer, params: types.CodeActionParams
) -> list[types.CodeAction] | None:
    owner = ls.hooks.cell_owner(ls, params.text_document.uri)
    if owner is not None and owner.code_actions is not None:
        return await owner.code_actions(ls, params)
    document = ls.open_document(params.text_document.uri)
    if document is None:
        return None
    only = params.context.only
    converter = PositionConverter(document.source, ls.position_encoding)
    actions, has_safe_fix = finding_actions(ls, params, document)
    if only is not None and kind_wanted(only, FIX_ALL_KIND):
        # Asked for by name (codeActionsOnSave, a fix-on-save hook): the edit
        # comes with the answer, so a single request is enough.
        fix_all = await _fix_all(ls, document, converter)
        if fix_all is not None:
            actions.append(fix_all)
    elif only is None and has_safe_fix:
        # The light bulb asks on every cursor move: fixing the whole file each
        # time would keep the analysis thread busy, so the edit waits for
        # codeAction/resolve when the client can ask for it.
        if _resolves_edits(ls):
            actions.append(_fix_all_action(ls, document, edit=None))
        else:
            fix_all = await _fix_all(ls, document, converter)
            if fix_all is not None:
                actions.append(fix_all)
    for provider in ls.hooks.action_providers:
        actions.extend(await provider(ls, params, document))
    return actions


def _resolves_edits(ls: OomLanguageServer) -> bool:
    support = ls.client_capabilities.text_document
    support = support.code_action if support else None
    support = support.resolve_support if support else None
    return support is not None and "edit" in support.properties


def _fix_all_action(
    ls: OomLanguageServer, document: TextDocument, edit: types.WorkspaceEdit | None
) -> types.CodeAction:
    return types.CodeAction(
        title=_noted(ls, document, FIX_ALL_TITLE, None),
        kind=FIX_ALL_KIND,
        edit=edit,
        data=None if edit is not None else {"uri": document.uri, "version": document.version},
    )


async def on_code_action_resolve(ls: OomLanguageServer, action: types.CodeAction) -> types.CodeAction:
    """Computes the fix-all edit listed without one. Returns the action
    unchanged (nothing to apply) when its document changed or closed since."""
    data: Any = action.data
    resolvers = ls.hooks.action_resolvers
    if isinstance(data, dict) and data.get("resolver") in resolvers:
        return await resolvers[data["resolver"]](ls, action)
    if action.kind != FIX_ALL_KIND or not isinstance(data, dict):
        return action
    document = ls.open_document(str(data.get("uri")))
    if document is None or document.version != data.get("version"):
        return action
    resolved = await _fix_all(ls, document, PositionConverter(document.source, ls.position_encoding))
    if resolved is not None:
        action.edit = resolved.edit
    return action


async def _fix_all(
    ls: OomLanguageServer, document: TextDocument, converter: PositionConverter
) -> types.CodeAction | None:
    from oom_lsp.analysis.autofix import fix_source  # libcst: not needed before the first fix-all

    await ls.settings_ready.wait()
    source, version = document.source, document.version
    settings = ls.settings_for_uri(document.uri)
    if settings is None:
        return None  # excluded by the project's configuration
    loop = asyncio.get_running_loop()
    result = await loop.run_in_executor(
        ls.analysis_executor, lambda: fix_source(source, settings, path=document.path or document.uri)
    )
    if result.applied == 0 or document.version != version:
        return None
    edit = _minimal_edit(source, result.source, converter)
    return _fix_all_action(ls, document, workspace_edit(ls, document, [edit]))


def _minimal_edit(old: str, new: str, converter: PositionConverter) -> types.TextEdit:
    """One edit replacing only the span that differs (keeps the cursor and
    folds of the untouched text where they were)."""
    prefix = len(os.path.commonprefix([old, new]))
    if prefix and old[prefix - 1] == "\r":
        prefix -= 1  # never split a \r\n
    limit = min(len(old), len(new)) - prefix
    suffix = len(os.path.commonprefix([old[::-1][:limit], new[::-1][:limit]]))
    end = len(old) - suffix
    if suffix and end > 0 and old[end - 1] == "\r" and old[end] == "\n":
        suffix -= 1
        end += 1
    return types.TextEdit(
        range=types.Range(start=converter.offset_to_lsp(prefix, old), end=converter.offset_to_lsp(end, old)),
        new_text=new[prefix : len(new) - suffix],
    )


# For the modules that answer code actions of their own documents (server/notebooks.py).
minimal_edit = _minimal_edit
