"""oom-lsp.estimate against the real server: a small script estimated on the
CPU against a GPU too small for its batch size gets OOM100 on the batch
literal, both code actions and the inlay hint; an edit removes them. Also
the `gpus` table of [tool.oom-lsp]."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

from oom_lsp.analysis.rule import MESSAGE_LIMIT
from oom_lsp.config import ConfigError, parse_config_table
from oom_lsp.estimate.gpus import UnknownGpuError, find_gpu
from tests import console
from tests.server.lsp_session import (
    BATCH_LINE,
    CONFIG,
    TRAINING_SCRIPT,
    apply_text_edits,
    diagnostics_for,
    edits_of,
    open_document,
    replace_text,
    start_session,
)

in_module_loop = pytest.mark.asyncio(loop_scope="module")

TIMEOUT_S = 120
# On the CPU the trace is byte-exact: 10 054 232 B at batch 64, 9 529 432 B + 8 200 B per sample;
# 9 700 KiB holds batch 49 at most with no margin (the model is too small for the default 10%).
GPU_MEMORY = "9700KiB"


@pytest_lsp.fixture(scope="module", params=["vscode-1.139.1"], config=CONFIG)
async def client(request: pytest.FixtureRequest, lsp_client: LanguageClient, tmp_path_factory):
    root = tmp_path_factory.mktemp("estimate-workspace")
    lsp_client.root = root
    lsp_client.statuses = []
    lsp_client.feature("oomLsp/memoryStatus")(lambda params: lsp_client.statuses.append(params._asdict()))
    lsp_client.hint_refreshes = 0

    @lsp_client.feature(types.WORKSPACE_INLAY_HINT_REFRESH)
    def refresh_hints(params: None) -> None:
        lsp_client.hint_refreshes += 1

    lsp_client.feature(types.WORKSPACE_CODE_LENS_REFRESH)(lambda params: None)

    lsp_client.init_result = await start_session(
        lsp_client,
        request.param,
        root,
        # OOM101 is off by default; selected, it takes the estimate's limit. Strict mode:
        # the sample's batch literal has no size facts around it.
        initialization_options={"settings": {"debounceMs": 0, "extendSelect": ["OOM101"], "strict": True}},
        configuration={"debounceMs": 0, "extendSelect": ["OOM101"], "strict": True},
    )
    yield
    await lsp_client.shutdown_session()


async def execute(client: LanguageClient, command: str, argument: dict):
    params = types.ExecuteCommandParams(command=command, arguments=[argument])
    return await asyncio.wait_for(client.workspace_execute_command_async(params), TIMEOUT_S)


async def hints(client: LanguageClient, uri: str) -> list[types.InlayHint]:
    whole = types.Range(start=types.Position(line=0, character=0), end=types.Position(line=100, character=0))
    result = await client.text_document_inlay_hint_async(
        types.InlayHintParams(text_document=types.TextDocumentIdentifier(uri=uri), range=whole)
    )
    return list(result or [])


@in_module_loop
async def test_estimate_over_the_gpu(client: LanguageClient):
    script = client.root / "train.py"
    script.write_text(TRAINING_SCRIPT)
    uri = script.as_uri()
    open_document(client, uri, TRAINING_SCRIPT)
    before = {str(d.code) for d in await diagnostics_for(client, uri, 1)}
    assert "OOM100" not in before and "OOM101" in before  # 64 > the default limit of 32

    shown_before = len(client.messages)
    result = await execute(
        client, "oom-lsp.estimate", {"uri": uri, "gpuMemory": GPU_MEMORY, "device": "cpu", "margin": 0}
    )

    assert result["verdict"] == "oom" and result["maxBatch"] == 49
    # Every client sees the verdict as a message (Neovim shows no hint by default), in the
    # words of the command's result.
    (said,) = client.messages[shown_before:]
    assert said.type == types.MessageType.Warning
    # The memory timeline page (`oom-lsp estimate --html`'s) is written beside the report, its
    # path in the message (VS Code opens it in a webview), its peak the estimate's.
    page = client.root / ".oom_lsp" / "estimate" / "train.html"
    assert Path(result["pagePath"]) == page
    assert said.message == "oom-lsp: " + result["message"] + f" Memory timeline: {page}"
    assert f'data-peak-bytes="{result["peakBytes"]}"' in page.read_text()
    assert result["message"] == (
        "Estimated peak of train.py at batch 64: ≈ 9.6 MiB allocated / 9.5 MiB: will run out of memory. "
        "Largest batch that fits: 49."
    )
    assert result["peakBytes"] == 10_054_232 and result["gpuMemoryBytes"] == 9700 * 1024
    assert Path(result["reportPath"]) == client.root / ".oom_lsp" / "estimate" / "train.json"
    assert (
        client.statuses[-1]["exceedsGpu"] is True and client.statuses[-1]["peakBytes"] == result["peakBytes"]
    )
    shown = await execute(client, "oom-lsp.showReport", {"uri": uri})
    assert shown == {"reportPath": result["reportPath"]}

    found = await diagnostics_for(client, uri, 1)
    (oom100,) = [d for d in found if d.code == "OOM100"]
    literal = TRAINING_SCRIPT.splitlines()[BATCH_LINE].index("64")
    assert oom100.severity == types.DiagnosticSeverity.Error
    assert (oom100.range.start.line, oom100.range.start.character, oom100.range.end.character) == (
        BATCH_LINE,
        literal,
        literal + 2,
    )
    assert "largest that fits: 49" in oom100.message
    assert len(oom100.message) < MESSAGE_LIMIT, oom100.message
    (oom101,) = [d for d in found if d.code == "OOM101"]
    assert "limit of 49" in oom101.message  # the estimate's largest batch, not 32

    assert client.hint_refreshes >= 1
    (hint,) = await hints(client, uri)
    assert hint.position == oom100.range.end
    # On the CPU the allocated peak is the one the verdict holds: no process total beside it.
    assert hint.label == "will run out of memory on 9.5 MiB: ≈ 9.6 MiB allocated at 64"
    # The estimate lens says the result until the next edit.
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    assert {lens.command.title for lens in lenses if lens.command.command == "oom-lsp.estimate"} == {
        "Estimated ≈ 9.6 MiB allocated / 9.5 MiB: will run out of memory"
    }

    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=oom100.range,
            context=types.CodeActionContext(diagnostics=[oom100]),
        )
    )
    by_title = {action.title: action for action in actions or []}
    assert {"Set batch size to 49 (largest that fits)", "Use gradient accumulation (32 x 2)"} <= set(by_title)
    accumulated = apply_text_edits(TRAINING_SCRIPT, edits_of(by_title["Use gradient accumulation (32 x 2)"], uri))
    assert "    GRADIENT_ACCUMULATION_STEPS = 2  # effective batch 32 x 2 = 64" in accumulated
    assert 'parser.add_argument("--batch-size", type=int, default=32)' in accumulated
    fitted = apply_text_edits(TRAINING_SCRIPT, edits_of(by_title["Set batch size to 49 (largest that fits)"], uri))
    assert fitted == TRAINING_SCRIPT.replace("default=64", "default=49")

    # Applying it is an edit: the hint, OOM100 and the status go; OOM101 keeps the estimate's limit.
    replace_text(client, uri, 2, fitted)
    after = await diagnostics_for(client, uri, 2)
    assert [str(d.code) for d in after if d.code in ("OOM100", "OOM101")] == []
    assert not await hints(client, uri)
    assert client.statuses[-1] == {"uri": uri, "peakBytes": None, "source": "estimate"}


async def _pids_recorded(record: Path) -> list[int]:
    deadline = asyncio.get_running_loop().time() + TIMEOUT_S
    while not (record.is_file() and record.read_text().endswith("\n")):
        assert asyncio.get_running_loop().time() < deadline, "the script never recorded its pids"
        await asyncio.sleep(0.1)
    return [int(pid) for pid in record.read_text().split()]


async def _all_gone(pids: list[int]) -> None:
    # The script runs inside the harness, its process group's leader: its pid is the group's id.
    deadline = asyncio.get_running_loop().time() + 15
    while any(console.alive(pid) for pid in pids) or console.members_of_session(pids[0]):
        assert asyncio.get_running_loop().time() < deadline, f"left behind: {pids}"
        await asyncio.sleep(0.1)


@in_module_loop
@pytest.mark.serial  # counts processes: the serial pass
@pytest.mark.parametrize("how", ["cancel-request", "progress-cancel"])
async def test_cancelling_an_estimate_leaves_no_process(client: LanguageClient, how: str):
    script, record = console.write_hanging_script(client.root, f"hangs_{how.replace('-', '_')}.py")
    known_tokens = set(client.progress_reports)
    params = types.ExecuteCommandParams(
        command="oom-lsp.estimate", arguments=[{"uri": script.as_uri(), "device": "cpu"}]
    )
    request = asyncio.ensure_future(
        client.protocol.send_request_async(types.WORKSPACE_EXECUTE_COMMAND, params, msg_id=how)
    )
    pids = await _pids_recorded(record)
    if how == "cancel-request":
        client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=how))
    else:
        (token,) = set(client.progress_reports) - known_tokens
        client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
    with pytest.raises(JsonRpcException):
        await asyncio.wait_for(request, TIMEOUT_S)
    await _all_gone(pids)


@in_module_loop
@pytest.mark.serial  # counts processes: the serial pass
@pytest.mark.parametrize("before", ["estimate", "profile"])
async def test_cancelling_a_validate_fix_leaves_no_process(client: LanguageClient, before: str):
    """oom-lsp.validateFix re-runs the measurement the fix is compared with (the server's
    last estimate of the file, or the project's last `oom-lsp profile`): cancelled, that
    run's whole process group goes."""
    script = client.root / f"validated_{before}.py"
    if before == "estimate":
        script.write_text(TRAINING_SCRIPT)
        await execute(client, "oom-lsp.estimate", {"uri": script.as_uri(), "device": "cpu"})
    else:
        from oom_lsp.profiling.report import DeviceInfo, Report, StepStats
        from oom_lsp.usecases.profile import LAST_PROFILE

        steps = [StepStats(index, 2**20) for index in (1, 2, 3)]
        report = Report(str(script), "finished", DeviceInfo("cpu"), steps_requested=3, steps=steps)
        report.peak_allocated = 2**20
        report.write(client.root / LAST_PROFILE)
    _, record = console.write_hanging_script(client.root, script.name)  # the "fix": it now hangs
    known_tokens = set(client.progress_reports)
    params = types.ExecuteCommandParams(command="oom-lsp.validateFix", arguments=[{"uri": script.as_uri()}])
    msg_id = f"validate-{before}"
    request = asyncio.ensure_future(
        client.protocol.send_request_async(types.WORKSPACE_EXECUTE_COMMAND, params, msg_id=msg_id)
    )
    pids = await _pids_recorded(record)
    if before == "profile":
        client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=msg_id))
    else:
        (token,) = set(client.progress_reports) - known_tokens
        client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
    with pytest.raises(JsonRpcException):
        await asyncio.wait_for(request, TIMEOUT_S)
    await _all_gone(pids)


@in_module_loop
async def test_a_failed_estimate_is_request_failed_without_the_servers_traceback(client: LanguageClient):
    script = client.root / "crashes.py"
    script.write_text((Path(__file__).resolve().parents[2] / "fixtures" / "estimate" / "crashes.py").read_text())
    params = types.ExecuteCommandParams(command="oom-lsp.estimate", arguments=[{"uri": script.as_uri(), "device": "cpu"}])
    with pytest.raises(JsonRpcException) as raised:
        await asyncio.wait_for(client.protocol.send_request_async(types.WORKSPACE_EXECUTE_COMMAND, params), TIMEOUT_S)
    assert raised.value.code == -32803  # RequestFailed, not InternalError
    assert raised.value.message.startswith("the estimate failed: ")
    assert "Traceback" not in raised.value.message and raised.value.data is None


DISTRIBUTED = Path(__file__).resolve().parents[2] / "fixtures" / "estimate" / "distributed"
SMALL_GPT = ["--dim", "256", "--vocab", "2048", "--block", "64", "--layers", "2"]


@in_module_loop
async def test_estimate_per_rank_of_a_world_size(client: LanguageClient):
    """worldSize traces a torchrun-style script as rank 0 of N, as --world-size does (what the
    figures per rank are is the estimate's: tests/estimate/test_distributed.py); the result, the
    kept report and the hint say the world size."""
    script = client.root / "fsdp2_gpt.py"
    source = (DISTRIBUTED / "fsdp2_gpt.py").read_text()
    script.write_text(source)
    uri = script.as_uri()
    open_document(client, uri, source)
    result = await execute(
        client, "oom-lsp.estimate", {"uri": uri, "device": "cpu", "args": SMALL_GPT, "worldSize": 4}
    )
    assert result["worldSize"] == 4
    report = json.loads(Path(result["reportPath"]).read_text())
    assert report["distributed"]["world_size"] == 4 and report["distributed"]["engines"]
    assert result["peakBytes"] == report["peak_bytes"]
    (hint,) = await hints(client, uri)
    assert hint.label.startswith("≈ ") and " allocated per rank of 4 at 8" in hint.label


@in_module_loop
@pytest.mark.parametrize(
    "arguments, problem",
    [
        ({"worldSize": 0}, "worldSize must be a whole number of GPUs"),
        ({"worldSize": -2}, "worldSize must be a whole number of GPUs"),
        ({"worldSize": 2, "nprocPerNode": 4}, "nprocPerNode must be from 1 to worldSize (2)"),
        ({"nprocPerNode": 4}, "nprocPerNode needs worldSize"),
    ],
)
async def test_a_wrong_world_size_is_named(client: LanguageClient, arguments: dict, problem: str):
    script = client.root / "train.py"
    script.write_text(TRAINING_SCRIPT)
    with pytest.raises(JsonRpcException) as raised:
        await execute(client, "oom-lsp.estimate", {"uri": script.as_uri(), "device": "cpu", **arguments})
    assert problem in raised.value.message


@in_module_loop
async def test_estimate_needs_a_file_on_disk(client: LanguageClient):
    with pytest.raises(Exception, match="no such file"):
        await execute(client, "oom-lsp.estimate", {"uri": (client.root / "missing.py").as_uri()})


def test_gpus_table_extends_the_catalogue(tmp_path: Path):
    config = parse_config_table({"gpus": {"Lab Card 20G": "20GiB", "Tiny": 1024}}, "pyproject.toml", tmp_path)
    assert config.gpus == {"Lab Card 20G": 20 * 2**30, "Tiny": 1024}
    assert find_gpu("lab card 20g", config.gpus).memory == 20 * 2**30
    assert find_gpu("RTX 3090", config.gpus).name == "GeForce RTX 3090"
    with pytest.raises(UnknownGpuError, match="did you mean 'Lab Card 20G'"):
        find_gpu("Lab Crd 20G", config.gpus)


@pytest.mark.parametrize("value", [{"Lab": "lots"}, {"Lab": True}, ["Lab"]])
def test_gpus_table_rejects_bad_sizes(tmp_path: Path, value):
    with pytest.raises(ConfigError, match="gpus"):
        parse_config_table({"gpus": value}, "pyproject.toml", tmp_path)
