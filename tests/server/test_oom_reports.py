"""The runtime guard's OOM report in the editor: a training run that fails under
`oom_guard` leaves `.oom_lsp/last_oom/report.json`; the server shows it as an
Error on the failing line (after didChangeWatchedFiles where the client
watches files for the server, else when the document is checked again), with
"Show the OOM report" and "Ask AI to fix this OOM"; and the instrument actions
("Insert memory monitoring", "Guard with oom_guard") on a training script."""

from __future__ import annotations

import ast
import asyncio
import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Union

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.llm.fake_server import FakeModelServer
from tests.server.lsp_session import (
    CLIENTS,
    CONFIG,
    TIMEOUT_S,
    apply_text_edits,
    diagnostics_for,
    edits_of,
    open_document,
    pulls,
    replace_text,
    start_session,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

FAILING_SCRIPT = """import torch

from oom_lsp.runtime import oom_guard

MESSAGE = (
    "CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 23.65 GiB of which "
    "1.10 GiB is free. Including non-PyTorch memory, this process has 22.54 GiB memory in use. Of the "
    "allocated memory 21.80 GiB is allocated by PyTorch, and 344.56 MiB is reserved by PyTorch but "
    "unallocated."
)


def train_step(batch):
    hidden = batch * 2
    raise torch.OutOfMemoryError(MESSAGE)


def train():
    batch = torch.randn(64, 16)
    for step in range(3):
        loss = train_step(batch)
        loss.backward()


with oom_guard():
    train()
"""
FAILING_LINE = 15  # raise torch.OutOfMemoryError(MESSAGE)
OOM_MESSAGE = "CUDA out of memory here: tried to allocate 1.5 GiB with 1.1 GiB free, batch 64"
OOM_ANSWER = """## Diagnosis
1. Activations kept in float32 (high): line 14 doubles the batch in float32.
## Edits
<<<<<<< SEARCH
    hidden = batch * 2
=======
    hidden = batch.half() * 2
>>>>>>> REPLACE
## Validation
The step's activations take half the memory.
## Changelog
Keep the hidden activations in half precision
"""
UNGUARDED = """import torch


def train(model, loader, optimizer):
    for inputs, labels in loader:
        loss = model(inputs).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def main():
    model, loader, optimizer = build()
    train(model, loader, optimizer)
"""
LOOP_LINE = 5  # for inputs, labels in loader:
CALL_LINE = 14  # train(model, loader, optimizer)
_names = itertools.count()


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModelServer]:
    with FakeModelServer() as server:
        yield server


@pytest_lsp.fixture(scope="module", params=list(CLIENTS), config=CONFIG)
async def client(
    request: pytest.FixtureRequest,
    lsp_client: LanguageClient,
    tmp_path_factory: pytest.TempPathFactory,
    fake: FakeModelServer,
):
    root = tmp_path_factory.mktemp("workspace")
    (root / "pyproject.toml").write_text("[project]\nname = 'demo'\n", encoding="utf-8")
    lsp_client.root = root
    lsp_client.client_name = request.param
    # lsprotocol reads any code action with a `command` as a Command; clients tell
    # them apart by the type of `command` (a string in a Command), as this does.
    lsp_client.protocol._converter.register_structure_hook(
        Union[types.Command, types.CodeAction],  # noqa: UP007 (the key lsprotocol registers its hook under)
        lambda value, _: lsp_client.protocol._converter.structure(
            value, types.Command if isinstance(value.get("command"), str) else types.CodeAction
        ),
    )
    settings = {"debounceMs": 0, "llm": {"enabled": True, "baseUrl": fake.base_url, "model": "test-model"}}
    lsp_client.init_result = await start_session(
        lsp_client,
        request.param,
        root,
        initialization_options={"settings": settings},
        configuration=settings,
    )
    yield
    await lsp_client.shutdown_session()


def _encoding(client: LanguageClient) -> str:
    return client.init_result.capabilities.position_encoding


async def _actions(
    client: LanguageClient,
    uri: str,
    selected: types.Range,
    diagnostics: list[types.Diagnostic],
    trigger: types.CodeActionTriggerKind | None = None,
    only: list[str] | None = None,
) -> list[types.CodeAction]:
    result = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=selected,
            context=types.CodeActionContext(diagnostics=diagnostics, trigger_kind=trigger, only=only),
        )
    )
    return list(result or [])


def _line(number: int) -> types.Range:
    return types.Range(
        start=types.Position(line=number - 1, character=4), end=types.Position(line=number - 1, character=4)
    )


def _run_failing_script(path: Path, environ: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        [sys.executable, path.name],
        check=False,
        cwd=path.parent,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(environ or {})},
    )
    assert done.returncode == 1 and "OutOfMemoryError" in done.stderr, done.stderr


async def test_an_oom_report_becomes_an_error_on_the_failing_line_with_its_actions(
    client: LanguageClient, fake: FakeModelServer
):
    path = client.root / "train_oom.py"
    path.write_text(FAILING_SCRIPT, encoding="utf-8")
    uri = path.as_uri()
    since = len(client.published)
    open_document(client, uri, FAILING_SCRIPT)
    assert not [
        d
        for d in await diagnostics_for(client, uri, 1, since)
        if d.severity == types.DiagnosticSeverity.Error
    ]
    watches = client.client_name == "vscode-1.139.1"
    if watches:
        registered = [
            watcher["globPattern"]
            for registration in client.registrations
            for watcher in registration.register_options["watchers"]
        ]
        assert "**/.oom_lsp/last_oom/report.json" in registered

    _run_failing_script(path)  # the training run that fails, under the guard

    report = client.root / ".oom_lsp" / "last_oom" / "report.json"
    version, since = 1, len(client.published)
    if watches:
        refreshes = client.diagnostic_refresh_count
        client.workspace_did_change_watched_files(
            types.DidChangeWatchedFilesParams(
                changes=[types.FileEvent(uri=report.as_uri(), type=types.FileChangeType.Created)]
            )
        )
        await _until(lambda: client.diagnostic_refresh_count > refreshes)
    elif not pulls(client):
        version = 2  # the next check of the document finds the report by its modification time
        replace_text(client, uri, version, FAILING_SCRIPT)
    errors = [
        d
        for d in await diagnostics_for(client, uri, version, since)
        if d.severity == types.DiagnosticSeverity.Error
    ]

    assert [(d.range.start.line + 1, d.range.start.character, d.message) for d in errors] == [
        (FAILING_LINE, 4, OOM_MESSAGE)
    ]
    actions = await _actions(client, uri, errors[0].range, errors)
    titles = [action.title for action in actions]
    assert "oom-lsp: Show the OOM report" in titles
    assert f"Ask AI to fix this OOM via {fake.base_url.split('/')[2]}" in titles

    show = next(action for action in actions if action.title == "oom-lsp: Show the OOM report")
    shown_before, messages_before = len(client.shown_documents), len(client.messages)
    result = await client.workspace_execute_command_async(
        types.ExecuteCommandParams(command=show.command.command, arguments=show.command.arguments)
    )
    prompt = report.parent / "prompt.md"
    if client.client_name == "neovim-0.7.2":  # no window/showDocument
        assert result["shown"] is False
        assert str(prompt) in client.messages[messages_before].message
    else:
        assert result["shown"] is True
        assert client.shown_documents[shown_before].uri == prompt.as_uri()

    if client.client_name == "vscode-1.139.1":
        ask = next(action for action in actions if action.title.startswith("Ask AI to fix this OOM"))
        fake.script({"content": OOM_ANSWER})
        resolved = await asyncio.wait_for(client.code_action_resolve_async(ask), TIMEOUT_S)
        assert resolved.edit is not None, [m.message for m in client.messages]
        fixed = apply_text_edits(FAILING_SCRIPT, edits_of(resolved, uri), _encoding(client))
        assert "    hidden = batch.half() * 2\n" in fixed
        prompt_sent = fake.requests[-1]["body"]["messages"][-1]["content"]
        assert "Tried to allocate 1.50 GiB" in prompt_sent
        assert "Batch size seen by the model: 64 (measured" in prompt_sent  # from the guard's report

    # Deleting the report dismisses the diagnostic.
    report.unlink()
    version, since = version + 1, len(client.published)
    if watches:
        refreshes = client.diagnostic_refresh_count
        client.workspace_did_change_watched_files(
            types.DidChangeWatchedFilesParams(
                changes=[types.FileEvent(uri=report.as_uri(), type=types.FileChangeType.Deleted)]
            )
        )
        await _until(lambda: client.diagnostic_refresh_count > refreshes)
    replace_text(client, uri, version, FAILING_SCRIPT)
    remaining = await diagnostics_for(client, uri, version, since)
    assert not [d for d in remaining if d.severity == types.DiagnosticSeverity.Error]


async def test_instrument_actions_apply(client: LanguageClient):
    uri = (client.root / f"unguarded{next(_names)}.py").as_uri()
    since = len(client.published)
    open_document(client, uri, UNGUARDED)
    await diagnostics_for(client, uri, 1, since)

    for line, title, expected in (
        (LOOP_LINE, "oom-lsp: Insert memory monitoring (needs oom-lsp where it trains)", "memory_monitor"),
        (CALL_LINE, "oom-lsp: Guard with oom_guard (needs oom-lsp where it trains)", "with oom_guard("),
    ):
        actions = [a for a in await _actions(client, uri, _line(line), []) if a.title == title]
        assert len(actions) == 1, title
        assert actions[0].kind == types.CodeActionKind.RefactorRewrite
        changed = apply_text_edits(UNGUARDED, edits_of(actions[0], uri), _encoding(client))
        assert expected in changed and "from oom_lsp.runtime import" in changed
        ast.parse(changed)

    only_quick_fixes = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=_line(LOOP_LINE),
            context=types.CodeActionContext(diagnostics=[], only=[types.CodeActionKind.QuickFix]),
        )
    )
    assert not [a for a in only_quick_fixes or [] if "memory monitoring" in a.title]


async def test_instrument_actions_wait_to_be_asked_off_the_header_line(client: LanguageClient):
    """VS Code asks for code actions on every cursor move (triggerKind Automatic): the rewrites
    answer those only on the header line of what they rewrite, so the body of a training loop,
    where nothing is wrong, shows no light bulb. Asked (Ctrl+., Refactor...), they are offered
    anywhere in the loop."""
    uri = (client.root / f"unguarded{next(_names)}.py").as_uri()
    since = len(client.published)
    open_document(client, uri, UNGUARDED)
    await diagnostics_for(client, uri, 1, since)
    automatic, invoked = types.CodeActionTriggerKind.Automatic, types.CodeActionTriggerKind.Invoked
    body_line = LOOP_LINE + 2  # loss.backward()

    def titles(actions: list[types.CodeAction]) -> list[str]:
        return [action.title for action in actions]

    assert await _actions(client, uri, _line(body_line), [], automatic) == []
    assert await _actions(client, uri, _line(CALL_LINE - 1), [], automatic) == []
    assert titles(await _actions(client, uri, _line(LOOP_LINE), [], automatic)) == [
        "oom-lsp: Insert memory monitoring (needs oom-lsp where it trains)"
    ]
    assert titles(await _actions(client, uri, _line(CALL_LINE), [], automatic)) == [
        "oom-lsp: Guard with oom_guard (needs oom-lsp where it trains)"
    ]
    assert titles(await _actions(client, uri, _line(body_line), [], invoked)) == [
        "oom-lsp: Insert memory monitoring (needs oom-lsp where it trains)"
    ]
    # VS Code's Refactor... menu names the kind: an explicit request, whatever the trigger.
    for only in (["refactor"], ["refactor.rewrite"]):
        asked = await _actions(client, uri, _line(body_line), [], automatic, only=only)
        assert titles(asked) == ["oom-lsp: Insert memory monitoring (needs oom-lsp where it trains)"], only
    # A client older than LSP 3.17 sends no triggerKind: it asks when the user does (Neovim 0.7).
    assert titles(await _actions(client, uri, _line(body_line), [])) == [
        "oom-lsp: Insert memory monitoring (needs oom-lsp where it trains)"
    ]


async def _until(condition) -> None:
    deadline = asyncio.get_running_loop().time() + TIMEOUT_S
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)


ESTIMATED_AND_GUARDED = """import argparse
import os

import torch
from torch.utils.data import DataLoader, TensorDataset

from oom_lsp.runtime import oom_guard

MESSAGE = (
    "CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 23.65 GiB of which "
    "1.10 GiB is free."
)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()
    data = TensorDataset(torch.randn(256, 1024), torch.randint(0, 10, (256,)))
    loader = DataLoader(data, batch_size=args.batch_size)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        if os.environ.get("SIMULATE_OOM"):
            raise torch.OutOfMemoryError(MESSAGE)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    with oom_guard():
        main()
"""
RAISE_LINE = 25  # raise torch.OutOfMemoryError(MESSAGE)


async def test_set_batch_size_from_the_estimate_on_the_oom(client: LanguageClient):
    if client.client_name != "vscode-1.139.1":
        pytest.skip("the action does not depend on the client; one estimate run is enough")
    client.feature("oomLsp/memoryStatus")(lambda params: None)
    client.feature(types.WORKSPACE_INLAY_HINT_REFRESH)(lambda params: None)
    client.feature(types.WORKSPACE_CODE_LENS_REFRESH)(lambda params: None)
    folder = client.root / "estimated"
    folder.mkdir()
    # The action is OOM101's fix at the estimate's limit: OOM101 (off by default) is selected,
    # in strict mode (the script's batch literal has no size facts around it).
    (folder / "pyproject.toml").write_text(
        "[project]\nname = 'estimated'\n\n[tool.oom-lsp]\nextend-select = ['OOM101']\nstrict = true\n", encoding="utf-8"
    )
    path = folder / "train_batch.py"
    path.write_text(ESTIMATED_AND_GUARDED, encoding="utf-8")
    _run_failing_script(path, {"SIMULATE_OOM": "1"})
    uri = path.as_uri()
    open_document(client, uri, ESTIMATED_AND_GUARDED)
    estimate = types.ExecuteCommandParams(
        # No margin: the model is too small for the default 10% (tests/server/test_estimate_commands.py).
        command="oom-lsp.estimate",
        arguments=[{"uri": uri, "gpuMemory": "9700KiB", "device": "cpu", "margin": 0}],
    )
    result = await asyncio.wait_for(client.workspace_execute_command_async(estimate), 120)
    assert result["maxBatch"] == 49
    (oom,) = [
        d
        for d in await diagnostics_for(client, uri, 1)
        if d.severity == types.DiagnosticSeverity.Error and d.code is None
    ]
    assert oom.range.start.line + 1 == RAISE_LINE

    actions = await _actions(client, uri, oom.range, [oom])

    (batch,) = [action for action in actions if action.title == "oom-lsp: Set batch size to 49"]
    fixed = apply_text_edits(ESTIMATED_AND_GUARDED, edits_of(batch, uri), _encoding(client))
    assert fixed == ESTIMATED_AND_GUARDED.replace("default=64", "default=49")
