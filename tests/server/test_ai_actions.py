"""'Ask AI to fix' in the editor, against the real server and the loopback
OpenAI-compatible model server of tests/llm: listed without an edit,
computed on codeAction/resolve (VS Code, Neovim 0.11.4) or through the
`oom-lsp.askAi` command and workspace/applyEdit (a client without resolve
support), logged in the fix log once applied; bad answers, cancellation, a
document edited meanwhile, and the LLM disabled."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Union

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.llm.conftest import FIXED_LINE, GARBAGE, GOOD_ANSWER, TRAIN
from tests.llm.fake_server import FakeModelServer
from tests.server.lsp_session import (
    CONFIG,
    TIMEOUT_S,
    apply_text_edits,
    diagnostics_for,
    edits_of,
    open_document,
    real_initialize_params,
    replace_text,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

NO_RESOLVE = "neovim-0.11.4-without-resolve"
CLIENT_NAMES = ["vscode-1.139.1", "neovim-0.11.4", NO_RESOLVE]
DISABLED_PROJECT = "[tool.oom-lsp.llm]\nenabled = false\n"
_names = itertools.count()


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


def _initialize_params(client_name: str) -> types.InitializeParams:
    if client_name != NO_RESOLVE:
        return real_initialize_params(client_name)
    params = real_initialize_params("neovim-0.11.4")
    assert params.capabilities.text_document and params.capabilities.text_document.code_action
    params.capabilities.text_document.code_action.resolve_support = None
    return params


@pytest_lsp.fixture(scope="module", params=CLIENT_NAMES, config=CONFIG)
async def client(
    request: pytest.FixtureRequest,
    lsp_client: LanguageClient,
    tmp_path_factory: pytest.TempPathFactory,
    fake: FakeModelServer,
):
    root = tmp_path_factory.mktemp("workspace")
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n", encoding="utf-8")
    (root / "disabled").mkdir()
    (root / "disabled" / "pyproject.toml").write_text(DISABLED_PROJECT, encoding="utf-8")
    lsp_client.root = root
    lsp_client.client_name = request.param
    lsp_client.texts = {}  # uri -> (version, text), as the editor has them
    # lsprotocol reads any code action with a `command` as a Command; clients tell
    # them apart by the type of `command` (a string in a Command), as this does.
    lsp_client.protocol._converter.register_structure_hook(
        Union[types.Command, types.CodeAction],
        lambda value, _: lsp_client.protocol._converter.structure(
            value, types.Command if isinstance(value.get("command"), str) else types.CodeAction
        ),
    )

    # Sent after an estimate (oom-lsp.validateFix's "before"); nothing to check here.
    lsp_client.feature("oomLsp/memoryStatus")(lambda params: None)
    lsp_client.feature(types.WORKSPACE_INLAY_HINT_REFRESH)(lambda params: None)
    lsp_client.feature(types.WORKSPACE_CODE_LENS_REFRESH)(lambda params: None)

    @lsp_client.feature(types.WORKSPACE_APPLY_EDIT)
    def apply_edit(params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
        lsp_client.applied_edits.append(params)
        for change in params.edit.document_changes or []:
            version, text = lsp_client.texts[change.text_document.uri]
            if change.text_document.version != version:
                return types.ApplyWorkspaceEditResult(applied=False, failure_reason="version mismatch")
            _edit(
                lsp_client,
                change.text_document.uri,
                apply_text_edits(text, change.edits, _encoding(lsp_client)),
            )
        return types.ApplyWorkspaceEditResult(applied=True)

    settings = {
        "debounceMs": 0,
        "llm": {"enabled": True, "baseUrl": fake.base_url, "model": "test-model", "timeout": 20},
    }
    lsp_client.set_configuration(settings, section="oomLsp")
    params = _initialize_params(request.param)
    params.root_uri = root.as_uri()
    params.root_path = str(root)
    params.workspace_folders = [types.WorkspaceFolder(uri=root.as_uri(), name=root.name)]
    params.initialization_options = {"settings": settings}
    lsp_client.init_result = await lsp_client.initialize_session(params)
    yield
    await lsp_client.shutdown_session()


def _encoding(client: LanguageClient) -> str:
    return client.init_result.capabilities.position_encoding


def _edit(client: LanguageClient, uri: str, text: str) -> None:
    version = client.texts[uri][0] + 1
    client.texts[uri] = (version, text)
    replace_text(client, uri, version, text)


async def _open(client: LanguageClient, folder: str = "") -> tuple[str, types.Diagnostic]:
    path = client.root / folder / f"train{next(_names)}.py"
    path.write_text(TRAIN, encoding="utf-8")
    uri = path.as_uri()
    since = len(client.published)
    open_document(client, uri, TRAIN)
    client.texts[uri] = (1, TRAIN)
    found = await diagnostics_for(client, uri, 1, since)
    return uri, next(diagnostic for diagnostic in found if diagnostic.code == "OOM301")


async def _actions(client: LanguageClient, uri: str, diagnostic: types.Diagnostic) -> list[types.CodeAction]:
    result = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=diagnostic.range,
            context=types.CodeActionContext(diagnostics=[diagnostic]),
        )
    )
    return [action for action in result or [] if "Ask AI" in action.title]


async def _ask_ai_action(client: LanguageClient, uri: str, diagnostic: types.Diagnostic) -> types.CodeAction:
    actions = await _actions(client, uri, diagnostic)
    assert [action.title for action in actions] == [f"Ask AI to fix (OOM301) via {_host(client)}"]
    assert actions[0].edit is None  # computed only when chosen
    return actions[0]


def _host(client: LanguageClient) -> str:
    return client.get_configuration(section="oomLsp")["llm"]["baseUrl"].split("/")[2]


async def _choose(client: LanguageClient, action: types.CodeAction) -> Any:
    """What the client does when the user picks the action: resolve it and apply
    its edit, then run its command; or run the command alone."""
    if action.data is not None:
        resolved = await asyncio.wait_for(client.code_action_resolve_async(action), TIMEOUT_S)
        if resolved.edit is None:
            return None
        change = resolved.edit.document_changes[0]
        uri = change.text_document.uri
        assert change.text_document.version == client.texts[uri][0]
        _edit(client, uri, apply_text_edits(client.texts[uri][1], edits_of(resolved, uri), _encoding(client)))
        assert resolved.command is not None
        return await _run(client, resolved.command)
    assert action.command is not None
    return await _run(client, action.command)


async def _run(client: LanguageClient, command: types.Command) -> Any:
    return await asyncio.wait_for(
        client.workspace_execute_command_async(
            types.ExecuteCommandParams(command=command.command, arguments=command.arguments)
        ),
        TIMEOUT_S,
    )


def _fix_log(client: LanguageClient) -> Path:
    return client.root / "OOM_FIXES.md"


async def test_ask_ai_applies_the_fix_and_logs_it(client: LanguageClient, fake: FakeModelServer):
    uri, diagnostic = await _open(client)
    action = await _ask_ai_action(client, uri, diagnostic)
    assert (action.data is None) == (client.client_name == NO_RESOLVE)
    sent = len(fake.requests)
    fake.script({"content": GOOD_ANSWER})
    progress_before = set(client.progress_reports)

    if action.data is not None:
        resolved = await asyncio.wait_for(client.code_action_resolve_async(action), TIMEOUT_S)
        (change,) = resolved.edit.document_changes
        assert change.text_document.version == 1  # stale edits are refused by the client
        if client.client_name == "vscode-1.139.1":
            annotation = resolved.edit.change_annotations["oom-lsp.ai-fix"]
            # needsConfirmation would open VS Code's preview with the change unticked: Apply applied nothing.
            assert annotation.needs_confirmation is False
            assert (
                annotation.label == "Accumulate the training loss with .item() so each step's graph is freed"
            )
            assert all(edit.annotation_id == "oom-lsp.ai-fix" for edit in change.edits)
        else:
            assert resolved.edit.change_annotations is None
        _edit(client, uri, apply_text_edits(TRAIN, edits_of(resolved, uri), _encoding(client)))
        result = await _run(client, resolved.command)
        assert result["logged"] is True
    else:
        result = await _run(client, action.command)
        assert result["applied"] is True, result
        assert len(client.applied_edits) == 1

    assert client.texts[uri][1] == TRAIN.replace("        total_loss += loss\n", FIXED_LINE)
    assert len(fake.requests) == sent + 1
    body = fake.requests[-1]["body"]
    assert "sk-proj-abcdefghijklmnopqrstuvwxyz012345" not in str(body)  # secrets redacted
    log = _fix_log(client).read_text(encoding="utf-8")
    assert "OOM301 loss-accumulated-with-graph" in log
    assert "+        total_loss += loss.item()" in log
    assert f"`{Path(uri).name}`" in log
    reports = [client.progress_reports[token] for token in set(client.progress_reports) - progress_before]
    assert len(reports) == 1
    kinds = [report.kind for report in reports[0]]
    assert kinds[0] == "begin" and kinds[-1] == "end" and "report" in kinds


async def test_an_ai_fix_below_page_breaks_lands_where_it_was_checked(
    client: LanguageClient, fake: FakeModelServer
):
    """A form feed, \\x1c and U+2028 in a comment above the edit end no line for the client
    (only \\n, \\r\\n and \\r do): the edit applied as the client applies it gives the
    text the server checked."""
    paged = TRAIN.replace("import torch\n", "import torch\n# page \x0c break \x1c \u2028 here\n", 1)
    path = client.root / f"paged{next(_names)}.py"
    path.write_text(paged, encoding="utf-8")
    uri = path.as_uri()
    since = len(client.published)
    open_document(client, uri, paged)
    client.texts[uri] = (1, paged)
    found = await diagnostics_for(client, uri, 1, since)
    diagnostic = next(diagnostic for diagnostic in found if diagnostic.code == "OOM301")
    assert diagnostic.range.start.line == 15
    action = await _ask_ai_action(client, uri, diagnostic)
    fake.script({"content": GOOD_ANSWER})

    await _choose(client, action)

    assert client.texts[uri][1] == paged.replace("        total_loss += loss\n", FIXED_LINE)


async def test_a_bad_answer_is_a_message_and_no_edit(client: LanguageClient, fake: FakeModelServer):
    uri, diagnostic = await _open(client)
    action = await _ask_ai_action(client, uri, diagnostic)
    fake.script({"content": GARBAGE}, {"content": GARBAGE})
    messages = len(client.messages)
    log_before = _fix_log(client).read_text(encoding="utf-8") if _fix_log(client).exists() else ""
    applied_before = len(client.applied_edits)

    result = await _choose(client, action)

    if client.client_name == NO_RESOLVE:
        assert result["applied"] is False
    else:
        assert result is None  # resolved without an edit
    assert client.texts[uri] == (1, TRAIN)
    assert len(client.applied_edits) == applied_before
    shown = [message.message for message in client.messages[messages:]]
    assert any("could not be read, twice" in message for message in shown), shown
    assert (_fix_log(client).read_text(encoding="utf-8") if _fix_log(client).exists() else "") == log_before


async def test_a_document_edited_while_the_model_answers_is_not_changed(
    client: LanguageClient, fake: FakeModelServer
):
    uri, diagnostic = await _open(client)
    action = await _ask_ai_action(client, uri, diagnostic)
    sent = len(fake.requests)
    fake.script({"delay": 1.0, "content": GOOD_ANSWER})
    messages = len(client.messages)
    choosing = asyncio.ensure_future(_choose(client, action))
    await _until(lambda: len(fake.requests) > sent)
    edited = TRAIN.replace("def evaluate", "def evaluate_model")
    _edit(client, uri, edited)

    result = await choosing

    assert result is None or result["applied"] is False
    assert client.texts[uri] == (2, edited)
    shown = [message.message for message in client.messages[messages:]]
    assert any("document changed" in message and "try again" in message for message in shown), shown


async def test_cancelling_a_hanging_model_stops_at_once(client: LanguageClient, fake: FakeModelServer):
    uri, diagnostic = await _open(client)
    action = await _ask_ai_action(client, uri, diagnostic)
    sent = len(fake.requests)
    fake.script({"delay": 60, "content": GOOD_ANSWER})
    if action.data is not None:
        method, params = types.CODE_ACTION_RESOLVE, action
    else:
        method = types.WORKSPACE_EXECUTE_COMMAND
        params = types.ExecuteCommandParams(
            command=action.command.command, arguments=action.command.arguments
        )
    msg_id = f"cancel-me-{next(_names)}"
    pending = asyncio.ensure_future(client.protocol.send_request_async(method, params, msg_id=msg_id))
    await _until(lambda: len(fake.requests) > sent)
    started = asyncio.get_running_loop().time()
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))

    with pytest.raises(Exception, match="cancel"):
        await asyncio.wait_for(pending, TIMEOUT_S)

    assert asyncio.get_running_loop().time() - started < 3
    assert client.texts[uri] == (1, TRAIN)
    # The server is free again: the next request is answered.
    assert await _actions(client, uri, diagnostic)
    assert len(fake.requests) == sent + 1


async def test_a_cancelled_ask_changes_nothing_when_the_answer_comes_later(
    client: LanguageClient, fake: FakeModelServer
):
    """Through codeAction/resolve or the oom-lsp.askAi command (run by pygls as a task of
    its own behind the executeCommand request): the cancel stops the work, so an answer
    that arrives afterwards is neither applied nor logged."""
    uri, diagnostic = await _open(client)
    action = await _ask_ai_action(client, uri, diagnostic)
    sent, applied = len(fake.requests), len(client.applied_edits)
    log_before = _fix_log(client).read_text(encoding="utf-8") if _fix_log(client).exists() else ""
    fake.script({"delay": 2, "content": GOOD_ANSWER})
    if action.data is not None:
        method, params = types.CODE_ACTION_RESOLVE, action
    else:
        method = types.WORKSPACE_EXECUTE_COMMAND
        params = types.ExecuteCommandParams(
            command=action.command.command, arguments=action.command.arguments
        )
    msg_id = f"cancel-late-{next(_names)}"
    pending = asyncio.ensure_future(client.protocol.send_request_async(method, params, msg_id=msg_id))
    await _until(lambda: len(fake.requests) > sent)
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
    with pytest.raises(Exception, match="cancel"):
        await asyncio.wait_for(pending, TIMEOUT_S)

    await asyncio.sleep(4)  # the model has answered by now
    assert len(client.applied_edits) == applied
    assert client.texts[uri] == (1, TRAIN)
    assert (_fix_log(client).read_text(encoding="utf-8") if _fix_log(client).exists() else "") == log_before


async def test_cancel_on_the_progress_stops_the_model(client: LanguageClient, fake: FakeModelServer):
    uri, diagnostic = await _open(client)
    action = await _ask_ai_action(client, uri, diagnostic)
    sent = len(fake.requests)
    fake.script({"delay": 60, "content": GOOD_ANSWER})
    tokens = set(client.progress_reports)
    messages = len(client.messages)
    choosing = asyncio.ensure_future(_choose(client, action))
    await _until(lambda: len(fake.requests) > sent)
    (token,) = set(client.progress_reports) - tokens
    started = asyncio.get_running_loop().time()

    client.protocol.notify(
        types.WINDOW_WORK_DONE_PROGRESS_CANCEL, types.WorkDoneProgressCancelParams(token=token)
    )
    result = await asyncio.wait_for(choosing, TIMEOUT_S)

    assert asyncio.get_running_loop().time() - started < 3
    assert result is None or result["applied"] is False
    assert client.texts[uri] == (1, TRAIN)
    assert client.progress_reports[token][-1].kind == "end"
    assert any("cancelled" in message.message for message in client.messages[messages:])


async def test_with_the_llm_disabled_nothing_is_sent(client: LanguageClient, fake: FakeModelServer):
    uri, diagnostic = await _open(client, folder="disabled")
    sent = len(fake.requests)
    messages = len(client.messages)

    actions = await _actions(client, uri, diagnostic)

    if client.client_name == "vscode-1.139.1":
        (action,) = actions
        assert action.title == "Ask AI to fix (OOM301) (not enabled)"
        assert action.edit is None and action.data is None and action.command is None
        assert "enabled = true" in action.disabled.reason
    else:
        assert actions == []  # no disabled actions in these clients: nothing rather than noise
    ask = types.Command(title="ask", command="oom-lsp.askAi", arguments=[{"uri": uri, "line": 15}])
    result = await _run(client, ask)
    assert result["applied"] is False
    assert "AI fixes are disabled" in result["message"]
    assert "AI fixes are disabled" in client.messages[messages].message
    assert len(fake.requests) == sent


async def _until(condition: Any) -> None:
    deadline = asyncio.get_running_loop().time() + TIMEOUT_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


def _oom_log(path: Path) -> str:
    return (
        "Traceback (most recent call last):\n"
        f'  File "{path}", line 11, in train\n'
        "    loss = model(inputs.cuda(), labels.cuda())\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity "
        "of 23.65 GiB of which 1.10 GiB is free. Of the allocated memory 21.80 GiB is allocated by PyTorch, "
        "and 344.56 MiB is reserved by PyTorch but unallocated.\n"
    )


async def test_ask_ai_to_fix_an_explained_oom(client: LanguageClient, fake: FakeModelServer):
    uri, _ = await _open(client)
    since = len(client.published)
    explain = types.Command(
        title="explain",
        command="oom-lsp.explainOom",
        arguments=[{"text": _oom_log(Path(uri[len("file://") :]))}],
    )
    await _run(client, explain)
    (oom,) = [
        d
        for d in await diagnostics_for(client, uri, 1, since)
        if d.severity == types.DiagnosticSeverity.Error and d.code is None
    ]
    assert oom.range.start.line == 10
    actions = await _actions(client, uri, oom)
    assert [action.title for action in actions] == [f"Ask AI to fix this OOM via {_host(client)}"]
    fake.script({"content": GOOD_ANSWER})

    result = await _choose(client, actions[0])

    assert result["applied" if client.client_name == NO_RESOLVE else "logged"] is True
    assert client.texts[uri][1] == TRAIN.replace("        total_loss += loss\n", FIXED_LINE)
    prompt_sent = fake.requests[-1]["body"]["messages"][-1]["content"]
    assert "Tried to allocate 1.50 GiB" in prompt_sent
    assert "· CUDA out of memory ·" in _fix_log(client).read_text(encoding="utf-8")
