"""The what-if in the editor against the real server over stdio, on fixtures/estimate/whatif/
small_loop.py (five memory mistakes a quick fix removes): the "What if…" lens, the table as
Markdown shown with window/showDocument, the quick fixes' titles with their measured saving for
the version the table was measured on only, and the estimate after a fix compared with the
prediction (within 5 %: a log line; beyond: a warning). What the what-if measures is the use
case's, tested through the CLI on the fixtures of every fix (tests/estimate/test_what_if.py);
the comparison after a fix, searched or not, in tests/usecases/test_estimate.py; the editor's
rows against the CLI's in tests/usecases/test_faces_agree.py."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

from oom_lsp.estimate.results import NotApplicable, Verdict, WhatIfBaseline
from oom_lsp.estimate.whatif_record import RECORD_FOLDER, load_record
from oom_lsp.estimate.wording import growth_words, saving_words
from oom_lsp.server.code_actions import FIX_ALL_TITLE
from oom_lsp.server.what_if import table_markdown
from oom_lsp.units import format_bytes
from tests import console
from tests.estimate.factories import what_if_row, what_if_table
from tests.server.lsp_session import (
    CONFIG,
    apply_text_edits,
    diagnostics_for,
    edits_of,
    open_document,
    replace_text,
    start_session,
)
from tests.server.test_estimate_commands import _all_gone, _pids_recorded

in_module_loop = pytest.mark.asyncio(loop_scope="module")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "estimate" / "whatif"
# One trace per change (ten here): seconds on an idle 2-core machine.
WHAT_IF_TIMEOUT_S = 600
# small_loop.py: OOM101 (selected in the fixtures' pyproject.toml), OOM201, OOM304, OOM301, OOM502.
OOM304_ROW, OOM201_ROW = "fix:OOM304:26:9", "fix:OOM201:22:5"
ESTIMATE_TIMEOUT_S = 300
SAVING = re.compile(r", [−+]\d+\.\d % peak \([\d.]+ [KMG]?i?B → [\d.]+ [KMG]?i?B\)$")


@pytest_lsp.fixture(scope="module", params=["vscode-1.139.1"], config=CONFIG)
async def client(request: pytest.FixtureRequest, lsp_client: LanguageClient, tmp_path_factory):
    root = tmp_path_factory.mktemp("what-if-workspace")
    shutil.copy(FIXTURES / "pyproject.toml", root / "pyproject.toml")
    lsp_client.root = root
    lsp_client.statuses = []
    lsp_client.feature("oomLsp/memoryStatus")(lambda params: lsp_client.statuses.append(params._asdict()))
    lsp_client.feature(types.WORKSPACE_INLAY_HINT_REFRESH)(lambda params: None)
    lsp_client.feature(types.WORKSPACE_CODE_LENS_REFRESH)(lambda params: None)
    await start_session(
        lsp_client,
        request.param,
        root,
        initialization_options={"settings": {"debounceMs": 0}},
        configuration={"debounceMs": 0},
    )
    yield
    await lsp_client.shutdown_session()


async def execute(client: LanguageClient, command: str, argument: dict, timeout: float) -> dict:
    params = types.ExecuteCommandParams(command=command, arguments=[argument])
    return await asyncio.wait_for(client.workspace_execute_command_async(params), timeout)


async def quick_fix_titles(client: LanguageClient, uri: str, version: int) -> dict[str, str]:
    """The title of each diagnostic's quick fix by its code, and the fix-all's under "all"."""
    found = await diagnostics_for(client, uri, version)
    titles = {}
    for diagnostic in found:
        actions = await client.text_document_code_action_async(
            types.CodeActionParams(
                text_document=types.TextDocumentIdentifier(uri=uri),
                range=diagnostic.range,
                context=types.CodeActionContext(diagnostics=[diagnostic]),
            )
        )
        for action in actions or []:
            own = f"oom-lsp ({diagnostic.code}): "
            if action.title.startswith(own) and not action.title.startswith(f"{own}Ignore "):
                titles[str(diagnostic.code)] = action.title
            elif action.title.startswith(FIX_ALL_TITLE):
                titles["all"] = action.title
    return titles


def copy_of_the_fixture(
    client: LanguageClient, name: str, fixture: str = "risky_loop.py"
) -> tuple[Path, str, str]:
    """A what-if fixture under another name: each test has its own file (they may run in any
    order, on any xdist worker)."""
    script = client.root / name
    text = (FIXTURES / fixture).read_text(encoding="utf-8")
    script.write_text(text, encoding="utf-8")
    return script, script.as_uri(), text


@in_module_loop
async def test_the_lens_offers_what_if_next_to_the_estimate(client: LanguageClient):
    _, uri, text = copy_of_the_fixture(client, "lens.py")
    open_document(client, uri, text)
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    by_command: dict[str, list[int]] = {}
    for lens in lenses:
        by_command.setdefault(lens.command.command, []).append(lens.range.start.line)
    assert by_command["oom-lsp.whatIf"] == by_command["oom-lsp.estimate"] != []
    assert {lens.command.title for lens in lenses if lens.command.command == "oom-lsp.whatIf"} == {"What if…"}


@in_module_loop
async def test_titles_carry_the_savings_and_the_estimate_after_a_fix_compares(client: LanguageClient):
    """The what-if of a small loop; the titles with the savings for the version measured only;
    then the OOM304 fix applied and saved, and the estimate compared with the prediction."""
    script, uri, text = copy_of_the_fixture(client, "small_loop.py", "small_loop.py")
    open_document(client, uri, text)
    before = await quick_fix_titles(client, uri, 1)
    assert {"OOM304", "OOM201", "all"} <= set(before)
    assert not any(SAVING.search(title) for title in before.values()), before
    known_tokens = set(client.progress_reports)

    result = await execute(client, "oom-lsp.whatIf", {"uri": uri}, WHAT_IF_TIMEOUT_S)

    # Its progress: begun, reported, ended, cancellable.
    (token,) = set(client.progress_reports) - known_tokens
    reports = client.progress_reports[token]
    assert isinstance(reports[0], types.WorkDoneProgressBegin) and reports[0].cancellable
    assert isinstance(reports[-1], types.WorkDoneProgressEnd) and reports[-1].message == "done"
    # The table as Markdown in the results folder, shown to the user.
    markdown = Path(result["markdownPath"])
    assert markdown == client.root / ".oom_lsp" / "what-if" / "small_loop.md"
    assert [shown.uri for shown in client.shown_documents] == [markdown.as_uri()] and result["shown"] is True
    # Beside the file, not in its window: Neovim opens a split for a document shown without focus.
    assert client.shown_documents[-1].take_focus is False
    page = markdown.read_text(encoding="utf-8")
    # The record the next estimate compares with, shared with `oom-lsp estimate --what-if`.
    record = load_record(client.root, str(script))
    assert record is not None
    rows = {row.key: row for row in record.changes}
    base = record.baseline
    assert "| change | peak | change in peak | growth/step | fits | safety |" in page
    assert (
        f"**As it is: {format_bytes(base.needed_bytes)} process total** ({format_bytes(base.peak_bytes)} allocated)"
        in page
    )
    assert f"It {growth_words(base)}." in page
    titles = [change["title"] for change in result["changes"]]
    assert "OOM304 line 26: Drop `retain_graph=True`" in titles and "bf16 autocast (--dtype bf16)" in titles
    for change in result["changes"]:
        assert f"| {change['title'].replace('|', chr(92) + '|')} |" in page
    assert "- **bf16 autocast (--dtype bf16)**: with torch.autocast(" in page
    assert "## Not applicable\n\n- activation checkpointing per block: no repeated blocks" in page

    after = await quick_fix_titles(client, uri, 1)
    assert after["OOM304"] == f"{before['OOM304']}, {saving_words(rows[OOM304_ROW])}"
    assert after["OOM201"] == f"{before['OOM201']}, {saving_words(rows[OOM201_ROW])}"
    assert after["all"] == f"{FIX_ALL_TITLE}, {saving_words(rows['fixes:safe'])}"
    assert SAVING.search(after["OOM304"]), after["OOM304"]

    # Any edit drops the table: the next version's titles say nothing of it, even with the same text.
    replace_text(client, uri, 2, text + "# an edit\n")
    edited = await quick_fix_titles(client, uri, 2)
    assert edited == before, edited
    replace_text(client, uri, 3, text)
    assert await quick_fix_titles(client, uri, 3) == before

    # The user applies the OOM304 fix, saves, and estimates again.
    found = await diagnostics_for(client, uri, 3)
    (oom304,) = [d for d in found if d.code == "OOM304"]
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=oom304.range,
            context=types.CodeActionContext(diagnostics=[oom304]),
            # Without context.only: the same request as the light bulb's.
        )
    )
    (fix,) = [a for a in actions if a.kind == types.CodeActionKind.QuickFix and "retain_graph" in a.title]
    fixed = apply_text_edits(text, edits_of(fix, uri))
    assert "loss.backward()\n" in fixed and "backward(retain_graph=True)" not in fixed
    replace_text(client, uri, 4, fixed)
    script.write_text(fixed, encoding="utf-8")  # saved

    result = await execute(client, "oom-lsp.estimate", {"uri": uri}, ESTIMATE_TIMEOUT_S)

    check = result["whatIfCheck"]
    assert check["change"] == "OOM304 line 26: Drop `retain_graph=True`"
    assert check["agrees"] is True and abs(check["differencePercent"]) <= 5, check
    assert check["message"].startswith("what-if check: OOM304 line 26") and "within 5%" in check["message"]
    assert any(
        "what-if check: OOM304" in log.message and log.type == types.MessageType.Info
        for log in client.log_messages
    )
    assert not [m for m in client.messages if m.type == types.MessageType.Warning]

    # A prediction 20 % under what the estimate finds now: reported as oom-lsp's bug.
    (path,) = [
        path
        for path in (client.root / RECORD_FOLDER).glob("*.json")
        if json.loads(path.read_text(encoding="utf-8"))["script"] == str(script)
    ]
    record = json.loads(path.read_text(encoding="utf-8"))
    for row in record["changes"]:
        if row["key"] == OOM304_ROW:
            row["needed_bytes"] = int(row["needed_bytes"] * 0.8)
    path.write_text(json.dumps(record), encoding="utf-8")

    result = await execute(client, "oom-lsp.estimate", {"uri": uri}, ESTIMATE_TIMEOUT_S)

    difference = result["whatIfCheck"]["differencePercent"]
    assert result["whatIfCheck"]["agrees"] is False and 18 < difference < 32, result["whatIfCheck"]
    (warning,) = [m for m in client.messages if m.type == types.MessageType.Warning]
    assert warning.message.startswith("oom-lsp: what-if check: OOM304 line 26")
    assert f"(+{difference:.1f} %): the what-if's prediction is off by more than 5%, a bug in oom-lsp" in (
        warning.message
    )


@in_module_loop
async def test_cancelling_the_what_if_leaves_no_process(client: LanguageClient):
    script, record = console.write_hanging_script(client.root, "hangs.py")
    known_tokens = set(client.progress_reports)
    params = types.ExecuteCommandParams(command="oom-lsp.whatIf", arguments=[{"uri": script.as_uri()}])
    request = asyncio.ensure_future(
        client.protocol.send_request_async(types.WORKSPACE_EXECUTE_COMMAND, params, msg_id="what-if")
    )
    pids = await _pids_recorded(record)
    (token,) = set(client.progress_reports) - known_tokens
    client.window_work_done_progress_cancel(types.WorkDoneProgressCancelParams(token=token))
    with pytest.raises(JsonRpcException, match="cancelled"):
        await asyncio.wait_for(request, 120)
    await _all_gone(pids)
    assert not (client.root / ".oom_lsp" / "what-if" / "hangs.md").exists()


def test_the_markdown_says_what_fits_what_failed_and_what_does_not_apply():
    table = what_if_table(
        "train.py",
        [
            what_if_row(
                "knob:bf16",
                "bf16 | autocast",
                20 * 2**30,
                10 * 2**30,
                how="torch.autocast(...)",
                safety="changes numerics",
                fits=True,
                saving_percent=33.3,
            ),
            what_if_row(
                "fix:OOM201:9:1",
                "OOM201 line 9: Wrap in autocast",
                29 * 2**30,
                2**30,
                code="OOM201",
                safety="changes numerics",
                fits=False,
                fallback=True,
                saving_percent=3.3,
            ),
            what_if_row(
                "fix:OOM304:12:5",
                "OOM304 line 12: Drop `retain_graph=True`",
                None,
                code="OOM304",
                error="RuntimeError: Trying to backward through the graph a second time",
            ),
        ],
        device="cuda",
        gpu="NVIDIA GeForce RTX 3090",
        gpu_memory=24 * 2**30,
        batch_size=64,
        baseline=WhatIfBaseline(30 * 2**30, 30 * 2**30, Verdict.OOM, False, 0, 0),
        not_applicable=[NotApplicable("fused AdamW", "the optimizer is SGD")],
    )
    page = table_markdown(table, "train.py")
    assert page.startswith(
        "# What if: train.py\n\nBatch size 64, device cuda, target NVIDIA GeForce RTX 3090"
    )
    assert "**As it is: 30.00 GiB peak**, will run out of memory." in page and "It grows" not in page
    assert "| bf16 \\| autocast | 20.00 GiB | −10.00 GiB (−33.3 %) | — | yes | changes numerics |" in page
    assert (
        "| OOM201 line 9: Wrap in autocast | 29.00 GiB | −1.00 GiB (−3.3 %) | — | no | changes numerics (real CPU steps) |"
        in page
    )
    assert (
        "## Not measured\n\n- OOM304 line 12: Drop `retain_graph=True`: RuntimeError: Trying to backward"
        in page
    )
    assert "## Not applicable\n\n- fused AdamW: the optimizer is SGD\n" in page
    # How a knob is applied; a fix's how is its title.
    assert "## How\n\n- **bf16 | autocast**: torch.autocast(...)\n\n" in page


@in_module_loop
async def test_what_if_of_unsaved_text_is_refused(client: LanguageClient):
    _, uri, text = copy_of_the_fixture(client, "unsaved.py")
    open_document(client, uri, text)
    replace_text(client, uri, 2, text + "# not saved\n")
    with pytest.raises(JsonRpcException, match="unsaved changes: save it first"):
        await execute(client, "oom-lsp.whatIf", {"uri": uri}, 60)


@in_module_loop
async def test_an_interpreter_without_torch_is_one_line(client: LanguageClient, tmp_path: Path):
    _, uri, _ = copy_of_the_fixture(client, "bare.py")
    bare = tmp_path / "bare"
    # A virtual environment of the base interpreter, without site packages: no torch in it.
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "venv", "--without-pip", str(bare))
    await proc.wait()
    with pytest.raises(JsonRpcException) as failure:
        await execute(client, "oom-lsp.whatIf", {"uri": uri, "python": str(bare / "bin" / "python")}, 120)
    message = str(failure.value)
    assert "the what-if failed" in message and "torch" in message and "\n" not in message.strip(), message
