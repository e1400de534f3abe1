"""Each use case through both faces on the same file: the installed console script as a person
runs it, and the real language server over stdio as VS Code drives it (its captured
capabilities). The figures must be the same: the two faces call one use case
(oom_lsp.usecases) and render its typed result, so a face that computed its own would fail here.

The estimate and the what-if trace fake tensors (exact on the CPU: byte for byte); the profile
is a real run of a script whose tensors are known (its peak the same to the byte from run to
run); the AI fix talks to the loopback model server of tests/llm.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

from oom_lsp.estimate.results import EstimateResult, WhatIfTable
from oom_lsp.estimate.wording import estimate_message, gpu_words, hint_label, lens_result
from tests import console
from tests.conftest import write_user_config
from tests.llm.conftest import GOOD_ANSWER, TRAIN
from tests.llm.fake_server import FakeModelServer
from tests.server.lsp_session import (
    CONFIG,
    TRAINING_SCRIPT,
    apply_text_edits,
    diagnostics_for,
    edits_of,
    open_document,
    replace_text,
    start_session,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

TIMEOUT_S = 300
PROFILING = Path(__file__).resolve().parents[2] / "fixtures" / "profiling"
# The editor's settings: the target GPU the lens uses (the palette command passes the same), and
# AI fixes through the loopback model.
GPU = "T4"


@pytest.fixture(scope="module")
def fake() -> Any:
    with FakeModelServer() as server:
        yield server


@pytest_lsp.fixture(scope="module", params=["vscode-1.139.1"], config=CONFIG)
async def client(
    request: pytest.FixtureRequest,
    lsp_client: LanguageClient,
    tmp_path_factory: pytest.TempPathFactory,
    fake: FakeModelServer,
):
    root = tmp_path_factory.mktemp("faces")
    (root / "pyproject.toml").write_text("[project]\nname = 'faces'\n", encoding="utf-8")
    lsp_client.root = root
    lsp_client.feature("oomLsp/memoryStatus")(lambda params: None)
    lsp_client.feature(types.WORKSPACE_INLAY_HINT_REFRESH)(lambda params: None)
    lsp_client.feature(types.WORKSPACE_CODE_LENS_REFRESH)(lambda params: None)
    llm = {"enabled": True, "baseUrl": fake.base_url, "model": "test-model", "timeout": 30}
    settings = {"debounceMs": 0, "gpu": GPU, "llm": llm}
    await start_session(
        lsp_client,
        request.param,
        root,
        initialization_options={"settings": settings},
        configuration=settings,
    )
    yield
    await lsp_client.shutdown_session()


async def execute(client: LanguageClient, command: str, argument: dict[str, Any]) -> Any:
    params = types.ExecuteCommandParams(command=command, arguments=[argument])
    return await asyncio.wait_for(client.workspace_execute_command_async(params), TIMEOUT_S)


def cli(folder: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    done = console.run(list(args), cwd=folder, timeout=TIMEOUT_S, env=env)
    assert done.returncode in (0, 1), done.stderr
    return done


def script_in(client: LanguageClient, name: str, text: str) -> Path:
    path = client.root / name
    path.write_text(text, encoding="utf-8")
    return path


async def test_the_estimate_of_the_lens_is_the_clis(client: LanguageClient):
    """The lens sends the file alone: the server takes the GPU from the `gpu` setting, as the CLI
    takes `--gpu`, and both search the largest batch for that target."""
    script = script_in(client, "estimated.py", TRAINING_SCRIPT)
    uri = script.as_uri()
    open_document(client, uri, TRAINING_SCRIPT)
    lens_before = await estimate_lens_titles(client, uri)
    said_before = len(client.messages)

    editor = await execute(client, "oom-lsp.estimate", {"uri": uri})
    terminal = json.loads(
        cli(client.root, "estimate", str(script), "--gpu", GPU, "--find-max-batch", "--format", "json").stdout
    )

    result = EstimateResult.from_json(terminal)
    prediction = result.prediction
    assert editor["gpuName"] == prediction.gpu.name == "T4"
    assert editor["peakBytes"] == prediction.peak_bytes
    assert editor["reservedBytes"] == prediction.reserved_bytes
    assert editor["neededBytes"] == prediction.needed_bytes > prediction.peak_bytes  # the context, on CUDA
    assert editor["verdict"] == prediction.verdict.short
    assert editor["batchSize"] == prediction.batch_size == 64
    assert editor["maxBatch"] == result.max_batch.max_batch
    # The report the editor keeps is the CLI's JSON (but the trace's wall time).
    kept = json.loads(Path(editor["reportPath"]).read_text(encoding="utf-8"))
    for report in (kept, terminal):
        for entry in (report, report["max_batch"].get("verified") or {}):
            entry.pop("seconds", None)
    # Words name files relative to the process's folder: the server's is not the terminal's.
    relative = [json.dumps(report).replace(f"{client.root}/", "") for report in (kept, terminal)]
    assert relative[0] == relative[1]
    # The hint says the CLI's figures, in the words both faces use.
    hint = await client.text_document_inlay_hint_async(
        types.InlayHintParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(
                start=types.Position(line=0, character=0), end=types.Position(line=40, character=0)
            ),
        )
    )
    assert [item.label for item in hint or []] == [hint_label(prediction)]
    assert "allocated" in hint[0].label and "process total" in hint[0].label
    assert hint[0].label.startswith(f"{prediction.verdict.value} on {gpu_words(prediction.gpu)}: ")
    # Every client is told the verdict (a Neovim user sees no hint by default), in the CLI's figures.
    message = estimate_message(prediction, result.max_batch.max_batch, script.name)
    # The message then names the memory timeline page, the CLI's `--html` page of the same result.
    page = f" Memory timeline: {editor['pagePath']}"
    assert [said.message for said in client.messages[said_before:]] == [f"oom-lsp: {message}{page}"]
    assert editor["message"] == message
    assert f"/ {gpu_words(prediction.gpu)}: fits" in message and "process total" in message
    # The lens named the setting's GPU before, and says the result after.
    assert lens_before == {f"Estimate peak memory ({gpu_words(prediction.gpu)})"}
    assert await estimate_lens_titles(client, uri) == {lens_result(prediction)}


async def estimate_lens_titles(client: LanguageClient, uri: str) -> set[str]:
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    return {lens.command.title for lens in lenses or [] if lens.command.command == "oom-lsp.estimate"}


async def test_the_what_if_of_the_editor_is_the_clis(client: LanguageClient):
    script = script_in(client, "what_if.py", TRAINING_SCRIPT)
    open_document(client, script.as_uri(), TRAINING_SCRIPT)

    editor = await execute(client, "oom-lsp.whatIf", {"uri": script.as_uri(), "device": "cpu"})
    table = WhatIfTable.from_json(
        json.loads(
            cli(
                client.root,
                "estimate",
                script.name,
                "--what-if",
                "--device",
                "cpu",
                "--gpu",
                GPU,
                "--format",
                "json",
            ).stdout
        )
    )

    assert editor["neededBytes"] == table.baseline.needed_bytes
    assert editor["peakBytes"] == table.baseline.peak_bytes
    # The lens's what-if judges by the setting's GPU, as the CLI's by --gpu.
    assert table.gpu_memory is not None and editor["gpuMemoryBytes"] == table.gpu_memory
    rows = {row.key: (row.needed_bytes, row.saving_percent, row.error) for row in table.changes}
    assert {
        row["key"]: (row["neededBytes"], row["savingPercent"], row["error"]) for row in editor["changes"]
    } == rows
    assert rows, "no change measured"
    page = Path(editor["markdownPath"]).read_text(encoding="utf-8")
    assert "**As it is: " in page


async def test_the_profile_of_the_editor_is_the_clis(client: LanguageClient):
    for name in ("known_tensors.py", "known_buffers.py"):
        (client.root / name).write_text((PROFILING / name).read_text(encoding="utf-8"), encoding="utf-8")
    script = client.root / "known_tensors.py"

    editor = await execute(client, "oom-lsp.profile", {"uri": script.as_uri(), "steps": 2, "device": "cpu"})
    cli(client.root, "profile", script.name, "--steps", "2", "--device", "cpu", "--out", "terminal")
    terminal = json.loads((client.root / "terminal" / "report.json").read_text(encoding="utf-8"))
    kept = json.loads(Path(editor["reportPath"]).read_text(encoding="utf-8"))

    assert editor["steps"] == 2 and editor["status"] == terminal["status"] == "completed"
    assert editor["peakBytes"] == terminal["peak_allocated"] == kept["peak_allocated"] > 0
    assert [(line["line"], line["bytes"]) for line in kept["top_lines"]] == [
        (line["line"], line["bytes"]) for line in terminal["top_lines"]
    ]


async def test_the_explanation_of_the_editor_is_the_clis(client: LanguageClient):
    script = script_in(client, "failed.py", TRAIN)
    log = client.root / "run.log"
    log.write_text(
        "Traceback (most recent call last):\n"
        f'  File "{script}", line 11, in train\n'
        "    loss = model(inputs.cuda(), labels.cuda())\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity "
        "of 23.65 GiB of which 1.10 GiB is free. Of the allocated memory 21.80 GiB is allocated by PyTorch, "
        "and 344.56 MiB is reserved by PyTorch but unallocated.\n",
        encoding="utf-8",
    )
    editor = await execute(client, "oom-lsp.explainOom", {"path": str(log)})
    (terminal,) = json.loads(cli(client.root, "explain", "run.log", "--format", "json").stdout)["ooms"]

    (error,) = editor["errors"]
    assert error["triedToAllocate"] == terminal["tried_to_allocate"] == int(1.5 * 2**30)
    assert error["totalCapacity"] == terminal["total_capacity"]
    assert error["free"] == terminal["free"] and error["allocated"] == terminal["allocated"]
    assert (error["frame"]["path"], error["frame"]["line"]) == (str(script), 11)


async def test_the_ai_fix_of_the_editor_is_the_clis(
    client: LanguageClient, fake: FakeModelServer, tmp_path: Path
):
    script = script_in(client, "ai.py", TRAIN)
    uri = script.as_uri()
    open_document(client, uri, TRAIN)
    (diagnostic,) = [d for d in await diagnostics_for(client, uri, 1) if d.code == "OOM301"]
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=diagnostic.range,
            context=types.CodeActionContext(diagnostics=[diagnostic]),
        )
    )
    (ask,) = [action for action in actions or [] if "Ask AI" in action.title]
    fake.script({"content": GOOD_ANSWER}, {"content": GOOD_ANSWER})
    resolved = await asyncio.wait_for(client.code_action_resolve_async(ask), TIMEOUT_S)
    in_editor = apply_text_edits(TRAIN, edits_of(resolved, uri), "utf-16")

    # The same file, fixed from the terminal (with the user's own config enabling AI fixes).
    folder = tmp_path / "terminal"
    folder.mkdir()
    (folder / "ai.py").write_text(TRAIN, encoding="utf-8")
    home = tmp_path / "config-home"
    write_user_config(home, llm={"enabled": True, "base-url": fake.base_url, "model": "test-model"})
    cli(
        folder,
        "fix",
        "--ai",
        "ai.py",
        "--line",
        str(diagnostic.range.start.line + 1),
        env={**os.environ, "XDG_CONFIG_HOME": str(home)},
    )

    assert (folder / "ai.py").read_text(encoding="utf-8") == in_editor != TRAIN
    # One prompt: the same sections from the same facts.
    editor_prompt, terminal_prompt = (
        request["body"]["messages"][-1]["content"] for request in fake.requests[-2:]
    )
    assert editor_prompt == terminal_prompt


async def test_the_validation_of_the_editor_is_the_clis(client: LanguageClient):
    script = script_in(client, "validated.py", TRAINING_SCRIPT)
    uri = script.as_uri()
    open_document(client, uri, TRAINING_SCRIPT)
    await execute(client, "oom-lsp.estimate", {"uri": uri, "device": "cpu", "findMaxBatch": False})
    before = client.root / "before.json"
    before.write_text(
        cli(client.root, "estimate", script.name, "--device", "cpu", "--gpu", GPU, "--format", "json").stdout,
        encoding="utf-8",
    )
    fixed = TRAINING_SCRIPT.replace("default=64", "default=32")  # the fix: half the batch
    replace_text(client, uri, 2, fixed)
    with pytest.raises(JsonRpcException, match="save validated.py first"):
        await execute(client, "oom-lsp.validateFix", {"uri": uri})  # the run takes the file on disk
    script.write_text(fixed, encoding="utf-8")

    editor = await execute(client, "oom-lsp.validateFix", {"uri": uri})
    terminal = cli(client.root, "validate", script.name, "--before", "before.json", "--no-log").stdout

    assert editor["source"] == "estimate"
    assert editor["change"] == editor["after"] - editor["before"]
    assert f"peak before: {_size(editor['before'])}" in terminal
    assert f"peak after:  {_size(editor['after'])}" in terminal
    assert editor["after"] < editor["before"]


def _size(size: int) -> str:
    from oom_lsp.units import format_bytes

    return format_bytes(size)
