"""Code lenses "Estimate peak memory", "What if…" and "Profile memory" above the main guard
and the outermost training loops; no inlay hint before an estimate."""

from __future__ import annotations

import textwrap

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from oom_lsp.server.lenses import lens_lines
from tests.server.lsp_session import CONFIG, open_document, start_session

in_module_loop = pytest.mark.asyncio(loop_scope="module")

SCRIPT = textwrap.dedent(
    """\
    import torch


    def train(model, loader, optimizer):
        for epoch in range(3):
            for x, y in loader:
                loss = model(x).sum()
                loss.backward()
                optimizer.step()


    def evaluate(model, loader):
        for x, _ in loader:
            model(x)


    if __name__ == "__main__":
        train(*build())
    """
)


@pytest_lsp.fixture(scope="module", params=["vscode-1.139.1", "neovim-0.11.4"], config=CONFIG)
async def client(request: pytest.FixtureRequest, lsp_client: LanguageClient, tmp_path_factory):
    root = tmp_path_factory.mktemp("lens-workspace")
    lsp_client.root = root
    lsp_client.init_result = await start_session(
        lsp_client, request.param, root, initialization_options={"settings": {"debounceMs": 0}}
    )
    yield
    await lsp_client.shutdown_session()


@in_module_loop
async def test_lenses_above_the_main_guard_and_the_training_loop(client: LanguageClient):
    script = client.root / "train.py"
    script.write_text(SCRIPT)
    open_document(client, script.as_uri(), SCRIPT)
    assert client.init_result.capabilities.code_lens_provider is not None
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=script.as_uri()))
    )
    placed = sorted((lens.range.start.line, lens.command.title, lens.command.command) for lens in lenses)
    epoch_loop, main_guard = 4, 16  # the epoch loop holds the step loop: one pair for both
    # No oomLsp.gpu, no gpu-memory: the lens says the estimate will have no target to judge by.
    assert placed == [
        (epoch_loop, "Estimate peak memory (no target GPU)", "oom-lsp.estimate"),
        (epoch_loop, "Profile memory", "oom-lsp.profile"),
        (epoch_loop, "What if…", "oom-lsp.whatIf"),
        (main_guard, "Estimate peak memory (no target GPU)", "oom-lsp.estimate"),
        (main_guard, "Profile memory", "oom-lsp.profile"),
        (main_guard, "What if…", "oom-lsp.whatIf"),
    ]
    assert [list(lens.command.arguments) for lens in lenses] == [[{"uri": script.as_uri()}]] * 6
    commands = client.init_result.capabilities.execute_command_provider.commands
    assert {
        "oom-lsp.estimate",
        "oom-lsp.whatIf",
        "oom-lsp.profile",
        "oom-lsp.explainOom",
        "oom-lsp.showReport",
    } <= set(commands)


@in_module_loop
async def test_the_estimate_lens_names_the_target_the_command_will_use(client: LanguageClient):
    """The project's gpu-memory, as the CLI reads it (the oomLsp.gpu setting: test_faces_agree)."""
    for config, expected in (('gpu-memory = "24GiB"', "Estimate peak memory (24 GiB)"),):
        project = client.root / f"project{len(config)}"
        project.mkdir()
        (project / "pyproject.toml").write_text(f"[project]\nname = 'p'\n\n[tool.oom-lsp]\n{config}\n")
        script = project / "train.py"
        script.write_text(SCRIPT)
        open_document(client, script.as_uri(), SCRIPT)
        lenses = await client.text_document_code_lens_async(
            types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=script.as_uri()))
        )
        assert {lens.command.title for lens in lenses if lens.command.command == "oom-lsp.estimate"} == {
            expected
        }


@in_module_loop
async def test_no_inlay_hint_before_an_estimate(client: LanguageClient):
    script = client.root / "plain.py"
    script.write_text(SCRIPT)
    open_document(client, script.as_uri(), SCRIPT)
    assert client.init_result.capabilities.inlay_hint_provider is not None
    hints = await client.text_document_inlay_hint_async(
        types.InlayHintParams(
            text_document=types.TextDocumentIdentifier(uri=script.as_uri()),
            range=types.Range(
                start=types.Position(line=0, character=0), end=types.Position(line=20, character=0)
            ),
        )
    )
    assert not hints


@in_module_loop
async def test_no_lens_for_a_buffer_without_a_file(client: LanguageClient):
    uri = "untitled:Untitled-1"
    open_document(client, uri, SCRIPT)
    lenses = await client.text_document_code_lens_async(
        types.CodeLensParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
    assert not lenses


def test_main_guard_spellings():
    source = "if '__main__' == __name__:\n    pass\nif __name__ == '__main__' :\n    pass\n    if __name__ == '__main__':\n        pass\n"
    assert lens_lines(source) == [0, 2]
