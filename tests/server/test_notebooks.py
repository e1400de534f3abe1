"""Notebooks in the editor: the real server over stdio, driven with VS Code
1.139.1's captured capabilities (the only captured client with notebook
sync), as VS Code's notebook editor talks to it: notebookDocument/didOpen with
the cells, didChange with cell text edits and structure changes, per-cell
diagnostics, code actions, notebook fix-all and hover."""

from __future__ import annotations

import asyncio
import json

import nbformat
import pytest
import pytest_lsp
from lsprotocol import types
from pygls.exceptions import JsonRpcException
from pytest_lsp import LanguageClient

from tests.server.lsp_session import CONFIG, TIMEOUT_S, start_session, wait_for_published

pytestmark = pytest.mark.asyncio(loop_scope="module")

CLIENT = "vscode-1.139.1"

SETUP = "%matplotlib inline\nimport torch\nimport torch.nn as nn\ndevice = 'cuda'\nmodel = nn.Linear(8, 2).to(device)"
LOSS = "criterion = nn.CrossEntropyLoss()\nbatch = torch.randn(4, 8, device=device)\nlabels = torch.zeros(4, dtype=torch.long, device=device)"
LOOP = "total = 0\nfor step in range(3):\n    loss = criterion(model(batch), labels)\n    total += loss"
# A checkpoint restored into a model whose weights the size facts know (Llama 2 7B):
# OOM501 is shown by default.
LOAD = (
    "state = torch.load('ckpt.pt')\nimport transformers\n"
    "llm = transformers.AutoModelForCausalLM.from_pretrained('meta-llama/Llama-2-7b-hf').cuda()\n"
    "llm.load_state_dict(state)"
)


@pytest_lsp.fixture(scope="module", config=CONFIG)
async def client(lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("workspace")
    lsp_client.root = root
    lsp_client.init_result = await start_session(
        lsp_client,
        CLIENT,
        root,
        initialization_options={"settings": {"debounceMs": 0}},
        configuration={"debounceMs": 0},
    )
    yield
    await lsp_client.shutdown_session()


def _cell_uri(notebook: str, index: int) -> str:
    return f"vscode-notebook-cell:{notebook.removeprefix('file://')}#W{index}sZmlsZQ%3D%3D"


def _open(client: LanguageClient, name: str, sources: list[str]) -> tuple[str, list[str]]:
    notebook_uri = (client.root / name).as_uri()
    cells = [_cell_uri(notebook_uri, index) for index in range(len(sources))]
    client.notebook_document_did_open(
        types.DidOpenNotebookDocumentParams(
            notebook_document=types.NotebookDocument(
                uri=notebook_uri,
                notebook_type="jupyter-notebook",
                version=0,
                cells=[types.NotebookCell(kind=types.NotebookCellKind.Code, document=uri) for uri in cells],
            ),
            cell_text_documents=[
                types.TextDocumentItem(uri=uri, language_id="python", version=1, text=text)
                for uri, text in zip(cells, sources)
            ],
        )
    )
    return notebook_uri, cells


def _edit_cell(
    client: LanguageClient, notebook_uri: str, version: int, cell: str, cell_version: int, text: str
):
    client.notebook_document_did_change(
        types.DidChangeNotebookDocumentParams(
            notebook_document=types.VersionedNotebookDocumentIdentifier(uri=notebook_uri, version=version),
            change=types.NotebookDocumentChangeEvent(
                cells=types.NotebookDocumentCellChanges(
                    text_content=[
                        types.NotebookDocumentCellContentChanges(
                            document=types.VersionedTextDocumentIdentifier(uri=cell, version=cell_version),
                            changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
                        )
                    ]
                )
            ),
        )
    )


async def _wait_for(client: LanguageClient, condition, what: str) -> None:
    async def poll() -> None:
        while not condition():
            await asyncio.sleep(0.05)

    try:
        await asyncio.wait_for(poll(), TIMEOUT_S)
    except asyncio.TimeoutError:
        pytest.fail(f"timed out waiting for {what}; published: {client.diagnostics}")


def _codes(client: LanguageClient, uri: str) -> list[str]:
    return [str(diagnostic.code) for diagnostic in client.diagnostics.get(uri, [])]


async def test_the_server_advertises_notebook_sync_of_python_cells(client: LanguageClient) -> None:
    sync = client.init_result.capabilities.notebook_document_sync
    assert sync is not None
    selector = sync.notebook_selector[0]
    assert [cell.language for cell in selector.cells] == ["python"]
    kinds = client.init_result.capabilities.code_action_provider.code_action_kinds
    assert "source.fixAll.oom-lsp" in kinds and "notebook.source.fixAll.oom-lsp" in kinds


async def test_diagnostics_are_published_per_cell_with_cell_lines(client: LanguageClient) -> None:
    _, cells = _open(client, "train.ipynb", [SETUP, LOSS, LOOP, LOAD])
    await _wait_for(client, lambda: "OOM301" in _codes(client, cells[2]), "OOM301 in the loop's cell")
    assert "OOM501" in _codes(client, cells[3])
    assert _codes(client, cells[0]) == [] and _codes(client, cells[1]) == []
    accumulated = next(d for d in client.diagnostics[cells[2]] if d.code == "OOM301")
    # Line 4 of the cell (0-based 3), not of the joined program; the magic is no syntax error.
    assert accumulated.range.start.line == 3 and accumulated.range.start.character == 4
    # The Problems panel lists the rows under the notebook: each names its cell, as the CLI does.
    # The cell is named on the message line, before a quick fix's "help: ..." line.
    assert accumulated.message.split("\n")[0].endswith(" (cell 3)"), accumulated.message
    assert all(d.message.split("\n")[0].endswith(" (cell 4)") for d in client.diagnostics[cells[3]])
    restored = next(d for d in client.diagnostics[cells[3]] if d.code == "OOM501")
    assert restored.message.endswith(
        ' (cell 4)\n\nhelp: Pass `map_location="cpu"` and `weights_only=True`'
    ), restored.message
    # A pull for a cell answers nothing: cells are pushed, never shown twice.
    report = await client.text_document_diagnostic_async(
        types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(uri=cells[2]))
    )
    assert list(report.items) == []


async def test_a_change_in_one_cell_rechecks_the_cells_that_depend_on_it(client: LanguageClient) -> None:
    notebook, cells = _open(client, "depends.ipynb", [SETUP, LOSS, LOOP])
    await _wait_for(client, lambda: "OOM301" in _codes(client, cells[2]), "OOM301")
    # Cell 2 now makes the loss a Python number: cell 3, untouched, is clean again.
    _edit_cell(
        client,
        notebook,
        1,
        cells[1],
        2,
        LOSS.replace("criterion = nn.CrossEntropyLoss()", "def criterion(a, b):\n    return 0.0"),
    )
    await _wait_for(client, lambda: "OOM301" not in _codes(client, cells[2]), "OOM301 to go")
    _edit_cell(client, notebook, 2, cells[1], 3, LOSS)
    await _wait_for(client, lambda: "OOM301" in _codes(client, cells[2]), "OOM301 back")


async def test_every_version_of_an_edited_cell_is_answered(client: LanguageClient) -> None:
    # An editor (and the latency benchmark) knows a cell's edit is checked when that
    # version's diagnostics come, also when they are the same as before.
    notebook, cells = _open(client, "versions.ipynb", [SETUP, LOSS, LOOP])
    await wait_for_published(client, cells[1], 1)
    since = len(client.published)
    _edit_cell(client, notebook, 1, cells[1], 2, LOSS + "\n# a comment")
    assert list((await wait_for_published(client, cells[1], 2, since)).diagnostics) == []
    _edit_cell(client, notebook, 2, cells[2], 2, "# a comment\n" + LOOP)
    moved = (await wait_for_published(client, cells[2], 2, since)).diagnostics
    assert [(d.code, d.range.start.line) for d in moved] == [("OOM301", 4)]
    # The cells whose findings the edits did not change are not sent again.
    assert {params.uri for params in client.published[since:]} == {cells[1], cells[2]}


async def test_a_notebook_that_include_leaves_out_gets_no_diagnostics(client: LanguageClient) -> None:
    # As in a folder's `--check`: `include` without `*.ipynb` leaves notebooks out,
    # and `per-file-ignores` apply to a notebook by its path.
    scripts = client.root / "scripts_only"
    scripts.mkdir()
    (scripts / "pyproject.toml").write_text('[tool.oom-lsp]\ninclude = ["*.py"]\n')
    quiet = client.root / "quiet"
    quiet.mkdir()
    (quiet / "pyproject.toml").write_text('[tool.oom-lsp.per-file-ignores]\n"*.ipynb" = ["OOM301"]\n')
    _, left_out = _open(client, "scripts_only/train.ipynb", [SETUP, LOSS, LOOP, LOAD])
    _, ignored = _open(client, "quiet/train.ipynb", [SETUP, LOSS, LOOP, LOAD])
    _, checked = _open(client, "checked.ipynb", [SETUP, LOSS, LOOP, LOAD])
    await _wait_for(client, lambda: "OOM301" in _codes(client, checked[2]), "OOM301 in the included notebook")
    await _wait_for(client, lambda: "OOM501" in _codes(client, ignored[3]), "OOM501 in the quiet notebook")
    assert "OOM301" not in _codes(client, ignored[2])
    assert all(uri not in client.diagnostics for uri in left_out)


async def test_quick_fix_and_ignore_in_a_cell(client: LanguageClient) -> None:
    _, cells = _open(client, "fixes.ipynb", [SETUP, LOAD])
    await _wait_for(client, lambda: "OOM501" in _codes(client, cells[1]), "OOM501")
    diagnostic = next(d for d in client.diagnostics[cells[1]] if d.code == "OOM501")
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=cells[1]),
            range=diagnostic.range,
            context=types.CodeActionContext(diagnostics=[diagnostic]),
        )
    )
    titles = [action.title for action in actions]
    assert any(title.startswith("oom-lsp (OOM501): Pass map_location") for title in titles)
    assert "oom-lsp (OOM501): Ignore OOM501 for this line" in titles
    quick = next(action for action in actions if action.is_preferred)
    change = quick.edit.document_changes[0]
    assert change.text_document.uri == cells[1]
    assert change.edits[0].range.start.line == 0  # in the cell's own lines


async def test_notebook_fix_all_edits_each_changed_cell(client: LanguageClient) -> None:
    _, cells = _open(client, "fixall.ipynb", [SETUP, LOSS, LOOP, LOAD])
    await _wait_for(client, lambda: "OOM501" in _codes(client, cells[3]), "OOM501")
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=cells[0]),
            range=types.Range(
                start=types.Position(line=0, character=0), end=types.Position(line=0, character=0)
            ),
            context=types.CodeActionContext(diagnostics=[], only=["notebook.source.fixAll"]),
        )
    )
    assert [action.kind for action in actions] == ["notebook.source.fixAll.oom-lsp"]
    edited = {
        change.text_document.uri: change.edits[0].new_text for change in actions[0].edit.document_changes
    }
    assert set(edited) == {cells[2], cells[3]}
    assert ".item()" in edited[cells[2]] and "map_location" in edited[cells[3]]
    # source.fixAll on one cell fixes that cell only.
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=cells[3]),
            range=types.Range(
                start=types.Position(line=0, character=0), end=types.Position(line=0, character=0)
            ),
            context=types.CodeActionContext(diagnostics=[], only=["source.fixAll"]),
        )
    )
    assert [change.text_document.uri for change in actions[0].edit.document_changes] == [cells[3]]


async def test_hover_on_a_cell_diagnostic(client: LanguageClient) -> None:
    _, cells = _open(client, "hover.ipynb", [SETUP, LOSS, LOOP])
    await _wait_for(client, lambda: "OOM301" in _codes(client, cells[2]), "OOM301")
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=cells[2]),
            position=types.Position(line=3, character=6),
        )
    )
    assert hover is not None and "loss-accumulated-with-graph (OOM301)" in hover.contents.value


async def test_closing_the_notebook_clears_its_cells(client: LanguageClient) -> None:
    notebook, cells = _open(client, "close.ipynb", [SETUP, LOAD])
    await _wait_for(client, lambda: "OOM501" in _codes(client, cells[1]), "OOM501")
    client.notebook_document_did_close(
        types.DidCloseNotebookDocumentParams(
            notebook_document=types.NotebookDocumentIdentifier(uri=notebook),
            cell_text_documents=[types.TextDocumentIdentifier(uri=uri) for uri in cells],
        )
    )
    await _wait_for(client, lambda: _codes(client, cells[1]) == [], "the cell's diagnostics to clear")


TRAINING_CELLS = [
    "%matplotlib inline\nimport torch\nfrom torch.utils.data import DataLoader, TensorDataset",
    "data = TensorDataset(torch.randn(128, 32), torch.randint(0, 4, (128,)))\nloader = DataLoader(data, batch_size=16)",
    "model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))\n"
    "optimizer = torch.optim.Adam(model.parameters())",
    "for x, y in loader:\n    loss = torch.nn.functional.cross_entropy(model(x), y)\n"
    "    optimizer.zero_grad()\n    loss.backward()\n    optimizer.step()",
]


def _save(client: LanguageClient, name: str, sources: list[str]) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_markdown_cell("# Train"), *map(nbformat.v4.new_code_cell, sources)]
    nbformat.write(notebook, client.root / name)


async def _estimate(client: LanguageClient, cell: str) -> dict:
    params = types.ExecuteCommandParams(
        command="oom-lsp.estimate", arguments=[{"uri": cell, "device": "cpu", "gpuMemory": "8GiB"}]
    )
    return await asyncio.wait_for(client.workspace_execute_command_async(params), 240)


async def test_estimate_from_a_cell_runs_the_saved_notebook_and_names_cells(client: LanguageClient) -> None:
    _save(client, "estimated.ipynb", TRAINING_CELLS)
    # The cells as VS Code numbers them in the notebook document: the markdown cell first.
    _, cells = _open(client, "estimated.ipynb", ["# Train", *TRAINING_CELLS])
    result = await _estimate(client, cells[4])
    assert result["verdict"] == "fits" and result["batchSize"] == 16 and result["peakBytes"] > 0
    assert result["peakAt"]["cell"] in (4, 5), result  # the model's cell or the training loop's
    report = json.loads((client.root / ".oom_lsp" / "estimate" / "estimated.json").read_text())
    assert report["script"] == str(client.root / "estimated.ipynb")
    assert report["notebook"]["not_run"] == [{"cell": 2, "line": 1, "code": "%matplotlib inline"}]
    assert all(":cell " in place for place, _ in report["top_lines"] if "estimated.ipynb" in place)
    assert not list(client.root.glob(".estimated.oom-lsp-*.py"))  # the script is gone


async def test_estimate_of_a_notebook_that_cannot_run_is_one_line(client: LanguageClient) -> None:
    broken = [*TRAINING_CELLS[:3], "for x, y in loader\n    pass"]
    _save(client, "broken.ipynb", broken)
    _, cells = _open(client, "broken.ipynb", ["# Train", *broken])
    with pytest.raises(JsonRpcException) as raised:
        await _estimate(client, cells[1])
    assert raised.value.message == (
        "broken.ipynb: cell 5, line 1: SyntaxError: expected ':'; Run All stops there too"
    )


async def test_a_world_size_for_a_notebook_is_refused_in_one_line(client: LanguageClient) -> None:
    # Asked explicitly; the oomLsp.worldSize setting is for the project's torchrun scripts and
    # leaves notebooks alone.
    _save(client, "one_process.ipynb", TRAINING_CELLS)
    _, cells = _open(client, "one_process.ipynb", ["# Train", *TRAINING_CELLS])
    params = types.ExecuteCommandParams(
        command="oom-lsp.estimate", arguments=[{"uri": cells[4], "device": "cpu", "worldSize": 4}]
    )
    with pytest.raises(JsonRpcException) as raised:
        await asyncio.wait_for(client.workspace_execute_command_async(params), 60)
    assert "a notebook runs in one process" in raised.value.message
