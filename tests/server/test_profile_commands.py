"""oom-lsp.profile, oom-lsp.explainOom and oom-lsp.showReport against the real
server: real CPU profiles of small fixture scripts, progress, cancellation
(the whole process tree goes), memory status, diagnostics on the lines."""

from __future__ import annotations

import asyncio
import pickle
import re
import shutil
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

from oom_lsp.server.profiling import OutputRelay
from tests import console
from tests.server.lsp_session import CONFIG, diagnostics_for, open_document, replace_text, start_session

pytestmark = pytest.mark.asyncio(loop_scope="module")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "profiling"
MiB = 2**20
TIMEOUT_S = 120


@pytest_lsp.fixture(scope="module", params=["neovim-0.11.4"], config=CONFIG)
async def client(request: pytest.FixtureRequest, lsp_client: LanguageClient, tmp_path_factory):
    root = tmp_path_factory.mktemp("profile-workspace")
    for name in ("known_tensors.py", "known_buffers.py", "hangs.py", "fake_oom.py"):
        shutil.copy(FIXTURES / name, root / name)
    lsp_client.root = root
    lsp_client.statuses = []
    lsp_client.feature("oomLsp/memoryStatus")(lambda params: lsp_client.statuses.append(params))
    lsp_client.init_result = await start_session(
        lsp_client, request.param, root, initialization_options={"settings": {"debounceMs": 0}}
    )
    yield
    await lsp_client.shutdown_session()


async def execute(client: LanguageClient, command: str, argument: dict, msg_id: str | None = None):
    params = types.ExecuteCommandParams(command=command, arguments=[argument])
    future = client.protocol.send_request_async(types.WORKSPACE_EXECUTE_COMMAND, params, msg_id=msg_id)
    return await asyncio.wait_for(future, TIMEOUT_S)


def line_of(path: Path, marker: str) -> int:
    """0-based line of the first line containing `marker`."""
    return next(index for index, text in enumerate(path.read_text().splitlines()) if marker in text)


def status_of(params) -> dict:
    return params if isinstance(params, dict) else params._asdict()


async def test_profile_result_progress_status_and_lines(client: LanguageClient):
    root: Path = client.root
    script, buffers = root / "known_tensors.py", root / "known_buffers.py"
    open_document(client, script.as_uri(), script.read_text())
    open_document(client, buffers.as_uri(), buffers.read_text())
    known_tokens = set(client.progress_reports)

    result = await execute(client, "oom-lsp.profile", {"uri": script.as_uri(), "steps": 2, "device": "cpu"})

    assert Path(result["reportPath"]).is_file()
    assert Path(result["reportPath"]).parent == root / ".oom_lsp" / "profile" / "known_tensors"
    assert 12 * MiB <= result["peakBytes"] <= 12 * MiB + 4096
    assert (result["device"], result["steps"], result["status"]) == ("cpu", 2, "completed")

    (token,) = set(client.progress_reports) - known_tokens
    kinds = [report.kind for report in client.progress_reports[token]]
    assert kinds[0] == "begin" and kinds[-1] == "end" and "report" in kinds
    assert client.progress_reports[token][0].cancellable is True

    status = status_of(client.statuses[-1])
    assert status["uri"] == script.as_uri() and status["source"] == "profile"
    assert status["peakBytes"] == result["peakBytes"] and status["reportPath"] == result["reportPath"]

    found = await diagnostics_for(client, buffers.as_uri(), 1)
    information = sorted(
        (d.range.start.line, d.message.split(" live")[0])
        for d in found
        if d.severity == types.DiagnosticSeverity.Information
    )
    assert information == [
        (line_of(buffers, "# 4 MiB"), "4.00 MiB"),
        (line_of(buffers, "# 8 MiB"), "8.00 MiB"),
    ]

    shown = await execute(client, "oom-lsp.showReport", {"uri": script.as_uri()})
    assert shown == {"reportPath": result["reportPath"]}

    # An edit makes the figures stale: they go, and the status bar is reset.
    replace_text(client, buffers.as_uri(), 2, buffers.read_text() + "\n")
    after = await diagnostics_for(client, buffers.as_uri(), 2)
    assert not [d for d in after if d.severity == types.DiagnosticSeverity.Information]
    replace_text(client, script.as_uri(), 2, script.read_text() + "\n")
    await diagnostics_for(client, script.as_uri(), 2)
    assert status_of(client.statuses[-1]) == {"uri": script.as_uri(), "peakBytes": None, "source": "profile"}


async def test_oom_during_profiling_is_an_error_on_the_failing_line(client: LanguageClient):
    script = client.root / "fake_oom.py"
    open_document(client, script.as_uri(), script.read_text())
    result = await execute(client, "oom-lsp.profile", {"uri": script.as_uri(), "steps": 3, "device": "cpu"})
    assert result["oom"]["triedToAllocate"] == 2 * 2**30
    failing = line_of(script, "raise RuntimeError(MESSAGE)")
    assert result["oom"]["frame"]["line"] == failing + 1
    errors = [
        d
        for d in await diagnostics_for(client, script.as_uri(), 1)
        if d.severity == types.DiagnosticSeverity.Error
    ]
    assert [d.range.start.line for d in errors] == [failing]
    assert "Out of memory here" in errors[0].message and "2.00 GiB" in errors[0].message


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")  # a zombie has no process left, only its exit status


@pytest.mark.serial  # counts processes: the serial pass
async def test_cancel_request_kills_the_process_tree(client: LanguageClient):
    script = client.root / "hangs.py"
    since, known_tokens = len(client.log_messages), set(client.progress_reports)
    request = asyncio.ensure_future(
        execute(client, "oom-lsp.profile", {"uri": script.as_uri(), "device": "cpu"}, msg_id="profile-hangs")
    )
    child = await _child_of_hangs(client, since)
    (token,) = set(client.progress_reports) - known_tokens
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="profile-hangs"))
    with pytest.raises(JsonRpcException):
        await request
    await _gone(child)
    # The request is answered at once; the run ends (and frees its script for
    # the next profile) when its process group is gone: its progress ends then.
    deadline = asyncio.get_running_loop().time() + 30
    while not client.progress_reports[token] or client.progress_reports[token][-1].kind != "end":
        assert asyncio.get_running_loop().time() < deadline, "the cancelled run never ended its progress"
        await asyncio.sleep(0.1)


async def _child_of_hangs(client: LanguageClient, since: int) -> int:
    """The pid of the sleeping child hangs.py starts, from the script's output in the log."""
    deadline = asyncio.get_running_loop().time() + 60
    while True:
        assert asyncio.get_running_loop().time() < deadline, "the script never started its child"
        for message in client.log_messages[since:]:
            match = re.search(r"\[hangs.py\] child (\d+)", message.message)
            if match:
                child = int(match.group(1))
                assert _alive(child)
                return child
        await asyncio.sleep(0.1)


async def _gone(pid: int) -> None:
    deadline = asyncio.get_running_loop().time() + 10
    while _alive(pid):
        assert asyncio.get_running_loop().time() < deadline, f"process {pid} outlived the cancel"
        await asyncio.sleep(0.1)


async def test_cancel_from_the_progress_kills_the_process_tree(client: LanguageClient):
    script = client.root / "hangs.py"
    since, known_tokens = len(client.log_messages), set(client.progress_reports)
    request = asyncio.ensure_future(
        execute(client, "oom-lsp.profile", {"uri": script.as_uri(), "device": "cpu"})
    )
    child = await _child_of_hangs(client, since)
    (token,) = set(client.progress_reports) - known_tokens
    with pytest.raises(JsonRpcException, match="already running"):
        await execute(client, "oom-lsp.profile", {"uri": script.as_uri(), "device": "cpu"})
    client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
    with pytest.raises(JsonRpcException, match="cancelled"):
        await request
    assert client.progress_reports[token][-1].kind == "end"
    await _gone(child)


async def test_cancel_leaves_no_process_of_the_script_group(client: LanguageClient):
    script, record = console.write_hanging_script(client.root, "hangs_recorded.py")
    request = asyncio.ensure_future(
        execute(client, "oom-lsp.profile", {"uri": script.as_uri(), "device": "cpu"}, msg_id="profile-recorded")
    )
    deadline = asyncio.get_running_loop().time() + 60
    while not (record.is_file() and record.read_text().endswith("\n")):
        assert asyncio.get_running_loop().time() < deadline, "the script never recorded its pids"
        await asyncio.sleep(0.1)
    pids = [int(pid) for pid in record.read_text().split()]
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="profile-recorded"))
    with pytest.raises(JsonRpcException):
        await request
    for pid in pids:
        await _gone(pid)
    # The script runs in the harness, the leader of its process group: nothing of the group is left.
    assert console.members_of_session(pids[0]) == []


async def test_explain_oom_puts_an_error_on_the_failing_line(client: LanguageClient):
    script = client.root / "train_explained.py"
    script.write_text("import torch\n\n\ndef step(model, x):\n    return model(x)\n")
    log = (
        "Traceback (most recent call last):\n"
        f'  File "{script}", line 5, in step\n'
        "    return model(x)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 6.00 GiB total "
        "capacity; 5.00 GiB already allocated; 3.00 MiB free; 5.10 GiB reserved in total by PyTorch)\n"
    )
    since = len(client.published)
    result = await execute(client, "oom-lsp.explainOom", {"text": log})
    (error,) = result["errors"]
    assert error["triedToAllocate"] == 20 * MiB and error["totalCapacity"] == 6 * 2**30
    assert error["frame"] == {"path": str(script), "line": 5, "function": "step", "code": "return model(x)"}
    # Not open: published for its URI anyway.
    deadline = asyncio.get_running_loop().time() + 10
    while not [p for p in client.published[since:] if p.uri == script.as_uri() and p.diagnostics]:
        assert asyncio.get_running_loop().time() < deadline, "no diagnostics for the failing file"
        await asyncio.sleep(0.05)
    published = [p for p in client.published[since:] if p.uri == script.as_uri()][-1]
    (diagnostic,) = published.diagnostics
    assert diagnostic.severity == types.DiagnosticSeverity.Error
    assert (diagnostic.range.start.line, diagnostic.range.start.character) == (4, 4)
    shown = await execute(client, "oom-lsp.showReport", {"uri": script.as_uri()})
    assert Path(shown["reportPath"]).is_file()

    # The same log read from a file, with the script open: the Error comes with its analysis.
    log_file = client.root / "train.log"
    log_file.write_text("epoch 1\n" + log + "done\n")
    open_document(client, script.as_uri(), script.read_text())
    result = await execute(client, "oom-lsp.explainOom", {"path": str(log_file)})
    assert [error["frame"]["line"] for error in result["errors"]] == [5]
    found = await diagnostics_for(client, script.as_uri(), 1)
    assert [(d.severity, d.range.start.line) for d in found if d.source == "oom-lsp" and d.code is None] == [
        (types.DiagnosticSeverity.Error, 4)
    ]


async def test_explaining_a_snapshot_puts_its_top_lines_on_the_source(client: LanguageClient):
    """`oom-lsp explain FILE.pickle` in the editor: the lines that hold the bytes live at the
    snapshot's peak get Information diagnostics (a line under 1 % of the peak gets none)."""
    script = client.root / "snap_train.py"
    script.write_text("import torch\n\nx = torch.ones(1)\ny = torch.ones(2)\nz = torch.ones(3)\n")
    user = str(script)

    def alloc(addr, size, line):
        frames = [{"filename": user, "line": line, "name": "<module>"}]
        return {"action": "alloc", "addr": addr, "size": size, "stream": 0, "frames": frames}

    trace = [alloc(0, 3 << 20, 3), alloc(1 << 22, 1 << 20, 4), alloc(1 << 23, 512, 5)]
    snapshot = client.root / "snap.pickle"
    snapshot.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}))
    open_document(client, script.as_uri(), script.read_text())
    result = await execute(client, "oom-lsp.explainOom", {"path": str(snapshot)})
    assert result["errors"] == [] and result["snapshot"]["peakAllocatedBytes"] == (4 << 20) + 512
    assert [(line["line"], line["bytes"]) for line in result["snapshot"]["topLines"]] == [
        (3, 3 << 20), (4, 1 << 20), (5, 512)
    ]
    found = await diagnostics_for(client, script.as_uri(), 1)
    mine = [d for d in found if d.source == "oom-lsp" and d.code is None]
    assert [(d.severity, d.range.start.line) for d in mine] == [
        (types.DiagnosticSeverity.Information, 2), (types.DiagnosticSeverity.Information, 3)
    ]
    assert mine[0].message.startswith("3.00 MiB live at the snapshot's peak of 4.00 MiB")


async def test_explain_oom_without_text_or_path_is_invalid(client: LanguageClient):
    with pytest.raises(JsonRpcException):
        await execute(client, "oom-lsp.explainOom", {})


async def test_a_flood_of_output_reaches_the_client_in_a_few_capped_batches(client: LanguageClient):
    script = client.root / "noisy.py"
    script.write_text("for i in range(200_000):\n    print('line', i)\n" + "print('x' * 100_000)\n")
    since = len(client.log_messages)
    result = await execute(client, "oom-lsp.profile", {"uri": script.as_uri(), "device": "cpu"})
    assert result["status"] == "finished"
    relayed = [m.message for m in client.log_messages[since:] if m.message.startswith("[noisy.py]")]
    assert sum(message.count("[noisy.py] ") for message in relayed) <= OutputRelay.MAX_LINES + 1
    assert len(relayed) < 50  # batches, not one notification a line
    assert "more lines of output not shown" in relayed[-1]
    assert max(len(message) for message in relayed) < OutputRelay.MAX_LINES * (OutputRelay.MAX_LINE_CHARS + 50)


async def test_the_profile_result_names_the_scripts_exception(client: LanguageClient):
    script = client.root / "crashes.py"
    shutil.copy(FIXTURES / "crashes.py", script)
    result = await execute(client, "oom-lsp.profile", {"uri": script.as_uri(), "device": "cpu"})
    assert result["status"] == "error"
    assert result["error"] == "ValueError: corrupt shard 17"
    assert result["message"].startswith("ValueError: corrupt shard 17")


async def test_explaining_a_huge_log_blocks_nothing_and_writes_only_in_the_workspace(
    client: LanguageClient, tmp_path_factory: pytest.TempPathFactory
):
    """The log names a file of another project: it gets its diagnostic, but nothing is
    written into that project's folder; and other requests are answered meanwhile."""
    other = tmp_path_factory.mktemp("other-project")
    (other / "train.py").write_text("import torch\n\n\ndef step(model, x):\n    return model(x)\n")
    oom = (
        "Traceback (most recent call last):\n"
        f'  File "{other / "train.py"}", line 5, in step\n'
        "    return model(x)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 6.00 GiB total "
        "capacity; 5.00 GiB already allocated; 3.00 MiB free; 5.10 GiB reserved in total by PyTorch)\n"
    )
    log = client.root / "huge.log"
    with open(log, "w") as stream:
        for step in range(400_000):
            stream.write(f"step {step}: loss 0.{step % 1000:03d} lr 1e-4 throughput 512 samples/s\n")
        stream.write(oom)
    assert log.stat().st_size > 20 * MiB
    explaining = asyncio.ensure_future(execute(client, "oom-lsp.explainOom", {"path": str(log)}))
    answered_first = []
    hover = client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=(client.root / "fake_oom.py").as_uri()),
            position=types.Position(line=0, character=0),
        )
    )
    hover_task = asyncio.ensure_future(hover)
    hover_task.add_done_callback(lambda _: answered_first.append("hover") if not explaining.done() else None)
    result = await explaining
    await hover_task
    assert answered_first == ["hover"]
    assert [error["frame"]["path"] for error in result["errors"]] == [str(other / "train.py")]
    assert not (other / ".oom_lsp").exists()
