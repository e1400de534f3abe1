"""AI fixes in the editor: "Ask AI to fix (OOMxxx)" on every oom-lsp finding and
"Ask AI to fix this OOM" on an out-of-memory error diagnostic (a runtime guard's
report, an explained log), and the command `oom-lsp.validateFix`.

The actions are listed at once, without an edit and without touching the
network; the model is asked only when one is chosen: in `codeAction/resolve`
when the client resolves edits, else through the command `oom-lsp.askAi`,
which applies the edit with `workspace/applyEdit`. Both report work-done
progress and stop when the client cancels the request or the progress. The
edit is a versioned `TextDocumentEdit` of the version the model was asked
about, refused when the document changed meanwhile, and carries a change
annotation (the changelog line, the model and host) where the client supports
one. The annotation does not ask for confirmation: VS Code opens such edits
unticked in its refactor preview, so "Apply" applied nothing; choosing the
action is the approval, the user can still preview it (Ctrl+Enter in the
light-bulb menu) and undo it. An applied fix is written to the project's fix
log (docs/ai-fixes.md).

An OOM error diagnostic, whoever publishes it, carries the error as
`data["error"]` (`OomError.to_dict()`); a finding's carries `data["finding"]`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import attrs
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument

from oom_lsp.analysis import Finding
from oom_lsp.config import ProjectConfig
from oom_lsp.server import code_actions, diagnostics
from oom_lsp.server.jobs import interpreter, latest_report, require_trusted_workspace, results_folder
from oom_lsp.server.positions import PositionConverter
from oom_lsp.server.protocol import RequestFailed
from oom_lsp.server.server import OomLanguageServer

logger = logging.getLogger(__name__)

RESOLVER = "oom-lsp.ai"
ASK_AI_COMMAND = "oom-lsp.askAi"
LOG_FIX_COMMAND = "oom-lsp.logAiFix"
VALIDATE_COMMAND = "oom-lsp.validateFix"
ANNOTATION_ID = "oom-lsp.ai-fix"
OOM_TITLE = "Ask AI to fix this OOM"
# The client applies a resolved edit and then runs its command: the document
# change it sends first may still be on its way.
APPLIED_WAIT_S = 2.0
_PENDING_LOGS_KEPT = 20
DEFAULT_VALIDATE_TIMEOUT_S = 600.0


@attrs.define
class AskAiArgs:
    uri: str
    line: int | None = None  # 1-based
    code: str | None = None


@attrs.define
class LogFixArgs:
    id: str


@attrs.define
class ValidateFixArgs:
    uri: str


@dataclass(frozen=True)
class _Target:
    """What the model is asked to fix: a finding or an OOM error (a dict, `OomError.to_dict()`),
    with the report of the run that failed when there is one (the runtime guard's)."""

    finding: Finding | None = None
    error: dict[str, Any] | None = None
    line: int | None = None
    report: str | None = None

    def to_data(self) -> dict[str, Any]:
        if self.finding is not None:
            return {"finding": self.finding.to_dict()}
        return {"error": self.error, "line": self.line, "report": self.report}

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> _Target:
        if isinstance(data.get("finding"), dict):
            return cls(finding=Finding.from_dict(data["finding"]))
        report = data.get("report")
        return cls(
            error=data.get("error"), line=data.get("line"), report=report if isinstance(report, str) else None
        )

    @classmethod
    def of_error(cls, diagnostic: types.Diagnostic) -> _Target:
        """The OOM error an error diagnostic carries in `data`."""
        data: Any = diagnostic.data
        return cls.from_data({**data, "line": diagnostic.range.start.line + 1})


@dataclass(frozen=True)
class _PendingLog:
    """A resolved proposal whose edit the client may apply; logged once it did."""

    uri: str
    new_text: str
    proposal: Any  # oom_lsp.llm.fixer.Proposal
    log: Path
    root: Path  # the project's: the log stays inside it
    display: str
    host: str


@dataclass
class AiState:
    """What a server keeps for AI fixes (`ls.state(AiState)`)."""

    pending_logs: OrderedDict[str, _PendingLog] = field(default_factory=OrderedDict)
    environments: dict[str, Any] = field(default_factory=dict)  # interpreter -> EnvironmentFacts
    notes_shown: set[str] = field(default_factory=set)


def register(server: OomLanguageServer) -> None:
    server.hooks.add_provider(list_actions, {RESOLVER: resolve_action})
    server.command(ASK_AI_COMMAND)(ask_ai)
    server.command(LOG_FIX_COMMAND)(log_fix)
    server.command(VALIDATE_COMMAND)(validate_fix)


# --- settings --------------------------------------------------------------------------------


def _path_of(uri: str) -> Path | None:
    path = to_fs_path(uri)
    return Path(path) if path else None


def _project(ls: OomLanguageServer, uri: str) -> ProjectConfig:
    return ls.lint_settings.project_config(_path_of(uri))


def _llm_settings(ls: OomLanguageServer, config: ProjectConfig) -> Any:
    """The user's settings (their config file, then the editor's `oomLsp.llm`) with what the
    project's table may set (oom_lsp.llm.settings); a broken user config file is
    reported and leaves AI fixes off."""
    from oom_lsp.config import ConfigError
    from oom_lsp.llm.settings import LlmSettings, resolve_settings

    try:
        settings = resolve_settings(config, editor=ls.editor.llm)
    except ConfigError as error:
        _note(ls, f"AI fixes are off: {error}")
        return LlmSettings()
    for note in settings.notes():
        _note(ls, note)
    return settings


def _note(ls: OomLanguageServer, message: str) -> None:
    # Once per session: the settings are resolved for every code-action request.
    shown = ls.state(AiState).notes_shown
    if message not in shown:
        shown.add(message)
        _show(ls, message)


# --- listing ---------------------------------------------------------------------------------


def _targets(
    params: types.CodeActionParams, document: TextDocument
) -> list[tuple[types.Diagnostic, _Target]]:
    """The context's current oom-lsp diagnostics that a model can be asked about."""
    targets = []
    for diagnostic in params.context.diagnostics:
        data: Any = diagnostic.data
        if diagnostic.source != diagnostics.SOURCE or not isinstance(data, dict):
            continue
        if isinstance(data.get("error"), dict):
            targets.append((diagnostic, _Target.of_error(diagnostic)))
        elif isinstance(data.get("finding"), dict) and data.get("version") == document.version:
            finding = Finding.from_dict(data["finding"])
            if finding.code != "OOM000":  # a syntax error is no memory problem
                targets.append((diagnostic, _Target(finding=finding)))
    return targets


def _title(target: _Target, host: str | None = None) -> str:
    base = f"Ask AI to fix ({target.finding.code})" if target.finding is not None else OOM_TITLE
    return f"{base} via {host}" if host else base


def _resolves_edits(ls: OomLanguageServer) -> bool:
    support = ls.client_capabilities.text_document
    support = support.code_action if support else None
    support = support.resolve_support if support else None
    return support is not None and "edit" in support.properties


async def list_actions(
    ls: OomLanguageServer, params: types.CodeActionParams, document: TextDocument
) -> list[types.CodeAction]:
    if not code_actions.kind_wanted(params.context.only, types.CodeActionKind.QuickFix):
        return []
    targets = _targets(params, document)
    if not targets:
        return []
    from oom_lsp.llm.settings import NotReady

    settings = _llm_settings(ls, _project(ls, document.uri))
    try:
        settings.check_ready()
    except NotReady as problem:
        # Only where the client shows it disabled, with the reason (VS Code keeps it out of the
        # light bulb): an action that merely says "not enabled" in every quick-fix menu of
        # the other clients would be noise. Their users get the reason from oom-lsp.askAi.
        if not ls.client_supports("text_document.code_action.disabled_support"):
            return []
        first = targets[0][1]
        return [
            types.CodeAction(
                title=_title(first) + " (not enabled)",
                kind=types.CodeActionKind.QuickFix,
                diagnostics=[diagnostic for diagnostic, _ in targets],
                disabled=types.CodeActionDisabled(reason=str(problem)),
            )
        ]
    actions = []
    for diagnostic, target in targets:
        data = {"resolver": RESOLVER, "uri": document.uri, "version": document.version, **target.to_data()}
        action = types.CodeAction(
            title=_title(target, settings.host),
            kind=types.CodeActionKind.QuickFix,
            diagnostics=[diagnostic],
            data=data,
        )
        if not _resolves_edits(ls):
            line = target.finding.line if target.finding is not None else target.line
            code = target.finding.code if target.finding is not None else None
            action.command = types.Command(
                title=action.title,
                command=ASK_AI_COMMAND,
                arguments=[{"uri": document.uri, "line": line, "code": code}],
            )
            action.data = None
        actions.append(action)
    return actions


# --- asking ----------------------------------------------------------------------------------


class _WorkDone:
    """Work-done progress for one request (when the client shows it), whose
    Cancel button sets `cancelled`."""

    def __init__(self, ls: OomLanguageServer, token: str | None) -> None:
        self._ls = ls
        self._token = token
        self.cancelled = asyncio.Event()

    def report(self, message: str) -> None:
        if self._token is not None:
            self._ls.work_done_progress.report(
                token=self._token, value=types.WorkDoneProgressReport(message=message)
            )


@asynccontextmanager
async def _work_done(ls: OomLanguageServer, title: str) -> AsyncIterator[_WorkDone]:
    token: str | None = None
    if ls.client_supports("window.work_done_progress"):
        token = str(uuid.uuid4())
        try:
            await asyncio.wait_for(ls.work_done_progress.create_async(token), timeout=5)
        except asyncio.TimeoutError:
            logger.warning("The client did not answer window/workDoneProgress/create; no progress shown")
            token = None
    progress = _WorkDone(ls, token)
    if token is None:
        yield progress
        return
    loop = asyncio.get_running_loop()
    ls.work_done_progress.tokens[token].add_done_callback(
        lambda _: loop.call_soon_threadsafe(progress.cancelled.set)
    )
    ls.work_done_progress.begin(token, types.WorkDoneProgressBegin(title=title, cancellable=True))
    try:
        yield progress
    finally:
        ls.work_done_progress.end(token, types.WorkDoneProgressEnd())
        ls.work_done_progress.tokens.pop(token, None)


@dataclass(frozen=True)
class _Outcome:
    """A checked edit for the document version asked about, or the message why there is none."""

    message: str
    edit: types.WorkspaceEdit | None = None
    pending: _PendingLog | None = None


def _read_report(path: str | None) -> Any:
    """The failed run's report (profile schema), or None when there is none or it
    cannot be read any more (the prompt then has the error alone)."""
    from oom_lsp.profiling.report import ReportError, read_report

    if path is None:
        return None
    try:
        return read_report(Path(path))
    except ReportError as error:
        logger.warning("Asking without the report %s: %s", path, error)
        return None


async def _environment(ls: OomLanguageServer, python: str) -> Any:
    from oom_lsp.llm.context import probe_environment

    environments = ls.state(AiState).environments
    if python not in environments:
        environments[python] = await asyncio.to_thread(probe_environment, python)
    return environments[python]


async def _ask(ls: OomLanguageServer, document: TextDocument, target: _Target) -> _Outcome:
    """Ask the model about `target` in the document as it is now; never raises for
    a user-facing problem (CancelledError aside, when the request is cancelled)."""
    from oom_lsp.profiling.oom_messages import OomError
    from oom_lsp.usecases.ai_fix import environment_of, fix_request, propose

    await ls.settings_ready.wait()
    uri, version, text = document.uri, document.version, document.source
    path = _path_of(uri)
    config = _project(ls, uri)
    settings = _llm_settings(ls, config)
    async with _work_done(ls, f"oom-lsp: {_title(target)}") as progress:
        report = _read_report(target.report)
        if report is not None:
            environment = environment_of(report)  # where the run failed, maybe another machine
        elif settings.enabled:
            progress.report("probing the Python environment")
            environment = await _environment(ls, interpreter(ls, None))
        else:
            environment = None
        request = fix_request(
            str(path or uri),
            text,
            version=version,
            line=target.line if target.finding is None else None,
            finding=target.finding,
            oom=OomError.from_dict(target.error) if target.error is not None else None,
            report=report,
            environment=environment,
            gpu_memory=config.gpu_memory,
            lint_settings=ls.settings_for_uri(uri),
            with_finding=False,  # the target is the diagnostic asked about
        )
        outcome = await propose(
            request, settings, on_progress=progress.report, cancel=progress.cancelled, stream=True
        )
    if not outcome.has_edit:
        return _Outcome(outcome.message)
    result = outcome.proposal
    current = ls.open_document(uri)
    if current is None or current.version != version:
        return _Outcome("the document changed while the model was answering; nothing was changed: try again")
    edit = _workspace_edit(ls, uri, version, text, result, settings.host)
    display = _display(path, config.root) if path else uri
    from oom_lsp.llm.fixlog import FixLogError

    try:
        log = settings.fix_log_path(config.root)
    except FixLogError as error:
        return _Outcome(f"no edit offered: {error}")
    pending = _PendingLog(uri, result.edit.new_text, result, log, config.root, display, settings.host)
    return _Outcome(result.changelog, edit, pending)


def _workspace_edit(
    ls: OomLanguageServer, uri: str, version: int | None, text: str, proposal: Any, host: str
) -> types.WorkspaceEdit:
    converter = PositionConverter(text, ls.position_encoding)
    annotate = ls.client_supports("workspace.workspace_edit.change_annotation_support")
    edits: list[types.TextEdit | types.AnnotatedTextEdit] = [
        types.AnnotatedTextEdit(
            range=converter.range_to_lsp(edit.range), new_text=edit.new_text, annotation_id=ANNOTATION_ID
        )
        if annotate
        else types.TextEdit(range=converter.range_to_lsp(edit.range), new_text=edit.new_text)
        for edit in proposal.edit.edits
    ]
    return types.WorkspaceEdit(
        document_changes=[
            types.TextDocumentEdit(
                text_document=types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version),
                edits=edits,
            )
        ],
        change_annotations={
            ANNOTATION_ID: types.ChangeAnnotation(
                label=proposal.changelog or "AI fix",
                # True would open VS Code's refactor preview with the change unticked.
                needs_confirmation=False,
                description=f"{proposal.model} via {host}",
            )
        }
        if annotate
        else None,
    )


def _display(path: Path, root: Path) -> str:
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except ValueError:
        return path.as_posix()


def _show(ls: OomLanguageServer, message: str, kind: types.MessageType = types.MessageType.Warning) -> None:
    ls.window_show_message(types.ShowMessageParams(type=kind, message=f"oom-lsp: {message}"))


def _write_log(pending: _PendingLog) -> str | None:
    """None when the entry is written, else why not (the fix itself stays applied)."""
    from oom_lsp.usecases.ai_fix import log_applied

    reason = log_applied(pending.proposal, pending.log, pending.display, pending.host, pending.root)
    if reason is None:
        return None
    return f"the fix is applied, but the fix log {pending.log} could not be written: {reason}"


# --- codeAction/resolve ----------------------------------------------------------------------


async def resolve_action(ls: OomLanguageServer, action: types.CodeAction) -> types.CodeAction:
    data: Any = action.data
    document = ls.open_document(str(data.get("uri")))
    if document is None or document.version != data.get("version"):
        _show(ls, "the document changed since the action was listed; nothing was changed: try again")
        return action
    outcome = await _ask(ls, document, _Target.from_data(data))
    if outcome.edit is None or outcome.pending is None:
        _show(ls, outcome.message)
        return action
    fix_id = uuid.uuid4().hex
    pending_logs = ls.state(AiState).pending_logs
    pending_logs[fix_id] = outcome.pending
    while len(pending_logs) > _PENDING_LOGS_KEPT:
        pending_logs.popitem(last=False)
    action.edit = outcome.edit
    # Run by the client after it applied the edit: the fix log records applied fixes only.
    action.command = types.Command(
        title="Log the AI fix", command=LOG_FIX_COMMAND, arguments=[{"id": fix_id}]
    )
    return action


async def log_fix(ls: OomLanguageServer, args: LogFixArgs) -> dict[str, Any]:
    pending = ls.state(AiState).pending_logs.pop(args.id, None)
    if pending is None:
        return {"logged": False, "message": "no such AI fix (already logged, or the server restarted)"}
    deadline = asyncio.get_running_loop().time() + APPLIED_WAIT_S
    while not _applied(ls, pending):
        if asyncio.get_running_loop().time() > deadline:
            logger.info("The AI fix of %s was not applied (or edited since); not logged", pending.uri)
            return {"logged": False, "message": "the edit was not applied; nothing logged"}
        await asyncio.sleep(0.05)
    problem = _write_log(pending)
    if problem is not None:
        _show(ls, problem)
        return {"logged": False, "message": problem}
    _show(ls, f"{pending.proposal.changelog} (logged in {pending.log.name})", types.MessageType.Info)
    return {"logged": True, "message": f"logged in {pending.log}"}


def _applied(ls: OomLanguageServer, pending: _PendingLog) -> bool:
    document = ls.open_document(pending.uri)
    return document is not None and document.source == pending.new_text


# --- oom-lsp.askAi (clients without resolve support) -----------------------------------------


async def ask_ai(ls: OomLanguageServer, args: AskAiArgs) -> dict[str, Any]:
    from oom_lsp.llm.settings import NotReady

    document = ls.open_document(args.uri)
    if document is None:
        return _answer(ls, False, f"{args.uri} is not open in the editor")
    settings = _llm_settings(ls, _project(ls, document.uri))
    try:
        settings.check_ready()
    except NotReady as problem:
        return _answer(ls, False, str(problem))
    target = await _find_target(ls, document, args)
    if target is None:
        return _answer(ls, False, "nothing to fix here: no oom-lsp diagnostic or OOM error at that line")
    outcome = await _ask(ls, document, target)
    if outcome.edit is None or outcome.pending is None:
        return _answer(ls, False, outcome.message)
    applied = await ls.workspace_apply_edit_async(
        types.ApplyWorkspaceEditParams(edit=outcome.edit, label=outcome.pending.proposal.changelog)
    )
    if not applied.applied:
        reason = f" ({applied.failure_reason})" if applied.failure_reason else ""
        return _answer(ls, False, f"the editor did not apply the AI fix{reason}; nothing logged")
    problem = _write_log(outcome.pending)
    if problem is not None:
        return _answer(ls, True, problem)
    return _answer(
        ls, True, f"{outcome.message} (logged in {outcome.pending.log.name})", types.MessageType.Info
    )


def _answer(
    ls: OomLanguageServer, applied: bool, message: str, kind: types.MessageType = types.MessageType.Warning
) -> dict[str, Any]:
    _show(ls, message, kind)
    return {"applied": applied, "message": message}


async def _find_target(ls: OomLanguageServer, document: TextDocument, args: AskAiArgs) -> _Target | None:
    """The finding `code` at `line`, else the OOM error diagnostic at `line`, else the
    line itself; without a line, the file's OOM error or else its first finding."""
    errors = [
        _Target.of_error(diagnostic)
        for diagnostic in diagnostics.extra_diagnostics(ls, document.uri)
        if isinstance(diagnostic.data, dict) and isinstance(diagnostic.data.get("error"), dict)
    ]
    findings = [f for f in (await ls.analysis_of(document)).findings if f.code != "OOM000"]
    if args.code is not None:
        matching = [f for f in findings if f.code == args.code and args.line in (None, f.line)]
        return _Target(finding=matching[0]) if matching else None
    if args.line is not None:
        error = next((error for error in errors if error.line == args.line), None)
        if error is not None:
            return error
        finding = next((f for f in findings if f.line == args.line), None)
        return _Target(finding=finding) if finding is not None else _Target(line=args.line)
    if errors:
        return errors[0]
    return _Target(finding=findings[0]) if findings else None


# --- oom-lsp.validateFix ---------------------------------------------------------------------


def _before_report(ls: OomLanguageServer, uri: str, root: Path) -> Path | None:
    """The measurement a fix is compared with: the server's last estimate or
    profile of the file (oom-lsp.estimate, oom-lsp.profile), else the last
    `oom-lsp profile` run in the project."""
    latest = latest_report(ls, uri)
    if latest is not None:
        return Path(latest)
    from oom_lsp.usecases.profile import LAST_PROFILE

    candidate = root / LAST_PROFILE
    return candidate if candidate.is_file() else None


def _unsaved(ls: OomLanguageServer, uri: str, path: Path) -> bool:
    document = ls.open_document(uri)
    if document is None:
        return False
    try:
        with open(path, encoding="utf-8", newline="") as stream:  # the file's own line endings
            return stream.read() != document.source
    except (OSError, UnicodeDecodeError):
        return False  # the measurement itself will say what is wrong with the file


async def validate_fix(ls: OomLanguageServer, args: ValidateFixArgs) -> dict[str, Any]:
    from oom_lsp.usecases.validate import MeasurementError, read_before

    require_trusted_workspace(ls, "validating a fix")
    path = _path_of(args.uri)
    if path is None or not path.is_file():
        raise RequestFailed(f"{args.uri}: not a file on disk")
    if _unsaved(ls, args.uri, path):
        raise RequestFailed(f"save {path.name} first: the measurement runs the file as it is on disk")
    config = _project(ls, args.uri)
    report = _before_report(ls, args.uri, config.root)
    if report is None:
        raise RequestFailed(
            f"no estimate or profile of {path.name} to compare with: "
            "run oom-lsp.estimate or oom-lsp.profile first"
        )
    try:
        before = read_before(report, path)
    except MeasurementError as error:
        raise RequestFailed(str(error)) from None
    cancel = threading.Event()
    ls.job_cancels.add(cancel)
    try:
        return await _validate(ls, path, config, before, cancel)
    finally:
        ls.job_cancels.discard(cancel)


async def _validate(
    ls: OomLanguageServer, path: Path, config: ProjectConfig, before: Any, cancel: threading.Event
) -> dict[str, Any]:
    from oom_lsp.llm import fixlog
    from oom_lsp.usecases.validate import MeasurementError, measure, record

    async with _work_done(ls, f"oom-lsp: measuring {path.name} again") as progress:
        progress.report(f"re-running the {before.kind}")
        work = asyncio.ensure_future(
            asyncio.to_thread(
                measure,
                path,
                before,
                python=interpreter(ls, None),
                timeout=DEFAULT_VALIDATE_TIMEOUT_S,
                out=results_folder(ls, path, "validate"),
                cancel=cancel,
            )
        )
        waiter = asyncio.ensure_future(progress.cancelled.wait())
        try:
            await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            cancel.set()  # $/cancelRequest: stop the run (its whole process group)
            raise
        finally:
            waiter.cancel()
        if not work.done():
            cancel.set()
            await asyncio.gather(work, return_exceptions=True)
            raise JsonRpcRequestCancelled("cancelled: nothing was measured")
        try:
            result = work.result()
        except MeasurementError as error:
            raise RequestFailed(str(error)) from None
    if result.refused:
        raise RequestFailed(f"not validated: {'; '.join(result.refused)}")
    change = result.change
    if change is None:
        raise RequestFailed(
            f"the new {result.after.kind} ended with status `{result.after.status}` before a peak was known"
        )
    try:
        log = _llm_settings(ls, config).fix_log_path(config.root)
    except fixlog.FixLogError as error:
        _show(ls, f"the figures were not recorded: {error}")
    else:
        record(result, log, _display(path, config.root), root=config.root)
    _show(ls, f"{path.name}: {change.render()}", types.MessageType.Info)
    return {
        "before": change.before,
        "after": change.after,
        "change": change.after - change.before,
        "source": before.kind,
        "withinNoise": result.within_noise,
    }
