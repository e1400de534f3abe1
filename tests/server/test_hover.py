"""Hover: a short summary of the rule (the message, why, the fix, a link to the full page) on a
diagnostic and on a code in a suppression comment, in the markup the client asks for."""

from __future__ import annotations

import itertools

import pytest
import pytest_asyncio
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from oom_lsp.output import rule_url
from tests.samples import LLAMA_ON_GPU
from tests.server.lsp_session import CONFIG, diagnostics_for, open_document, start_session

pytestmark = pytest.mark.asyncio(loop_scope="module")

_names = itertools.count()
TEXT = (
    "import torch\n"
    "\n"
    'state = torch.load("ckpt.pt")\n'
    'other = torch.load("b.pt", map_location="cpu")  # oom: ignore[OOM301, torch-load-without-map-location]\n'
    "value = 1  # noqa: E501, OOM501\n"
    + LLAMA_ON_GPU
    + 'net.load_state_dict(state["net"])\n'
)


async def _hover(client: LanguageClient, uri: str, line: int, character: int) -> types.Hover | None:
    return await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            position=types.Position(line=line, character=character),
        )
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def document(client: LanguageClient) -> str:
    uri = (client.root / f"hover{next(_names)}.py").as_uri()
    since = len(client.published)
    open_document(client, uri, TEXT)
    await diagnostics_for(client, uri, 1, since)
    return uri


MAX_HOVER_LINES = 15
URL = rule_url("OOM501", "torch-load-without-map-location")


async def test_hover_on_a_diagnostic_summarises_the_rule(client: LanguageClient, document: str):
    hover = await _hover(client, document, 2, 14)
    assert hover is not None
    # Every client here lists markdown first in its hover contentFormat.
    assert hover.contents.kind == types.MarkupKind.Markdown
    text = hover.contents.value
    lines = text.splitlines()
    assert len(lines) < MAX_HOVER_LINES, text
    # The message, one or two lines of why, the quick fix by its title, a link to the full page.
    headline = text.split("\n\n")[0]
    assert (
        " ".join(headline.splitlines())
        == "**OOM501** torch.load without map_location puts ≈ 25.1 GiB of weights (6.7 B parameters) back on "
        "the GPU it was saved from"
    )
    # Lines broken between words (Neovim's float wraps a longer line at any character), the
    # link's URL the only line longer; the CLI's command on a line of its own.
    assert [line for line in lines if len(line) > 78 and "](" not in line] == [], text
    assert "\n`oom-lsp rule OOM501`" in text
    assert "the one they were saved from" in text
    assert 'Quick fix: Pass `map_location="cpu"` (safe)' in text
    assert f"[torch-load-without-map-location (OOM501)]({URL})" in text
    assert "`oom-lsp rule OOM501`" in text
    # Not the rule page: no headings, no examples.
    assert not [line for line in lines if line.startswith("#")]
    assert "```" not in text
    assert hover.range == types.Range(
        start=types.Position(line=2, character=8), end=types.Position(line=2, character=29)
    )


async def test_hover_on_codes_inside_suppression_comments(client: LanguageClient, document: str):
    line_3 = TEXT.splitlines()[3]
    by_name = await _hover(client, document, 3, line_3.index("torch-load-without") + 3)
    assert by_name is not None and "(OOM501)" in by_name.contents.value
    assert len(by_name.contents.value.splitlines()) < MAX_HOVER_LINES
    # No finding there: the rule's summary and its remedy.
    assert by_name.contents.value.startswith("**OOM501** torch.load restores a checkpoint onto the GPU")
    assert 'Fix: Pass map_location="cpu" and move what you need.' in by_name.contents.value
    by_code = await _hover(client, document, 4, TEXT.splitlines()[4].index("OOM501") + 2)
    assert by_code is not None and "(OOM501)" in by_code.contents.value
    start = TEXT.splitlines()[4].index("OOM501")
    assert by_code.range == types.Range(
        start=types.Position(line=4, character=start), end=types.Position(line=4, character=start + 6)
    )


async def test_no_hover_elsewhere(client: LanguageClient, document: str):
    assert await _hover(client, document, 0, 3) is None
    # Another linter's code in a shared noqa is not ours.
    assert await _hover(client, document, 4, TEXT.splitlines()[4].index("E501") + 1) is None
    assert await _hover(client, document, 40, 0) is None


def _plain_text_only(params: types.InitializeParams) -> None:
    params.capabilities.text_document.hover = types.HoverClientCapabilities(
        content_format=[types.MarkupKind.PlainText]
    )


@pytest_lsp.fixture(scope="module", config=CONFIG)
async def plain_client(lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory):
    """Neovim 0.7.2's capabilities, with a hover that renders plain text only."""
    root = tmp_path_factory.mktemp("plain")
    lsp_client.root = root
    await start_session(
        lsp_client,
        "neovim-0.7.2",
        root,
        initialization_options={"settings": {"debounceMs": 0}},
        adjust=_plain_text_only,
    )
    yield
    await lsp_client.shutdown_session()


async def test_plain_text_hover_for_a_client_without_markdown(plain_client: LanguageClient):
    uri = (plain_client.root / "plain.py").as_uri()
    since = len(plain_client.published)
    open_document(plain_client, uri, TEXT)
    await diagnostics_for(plain_client, uri, 1, since)
    hover = await _hover(plain_client, uri, 2, 14)
    assert hover is not None
    assert hover.contents.kind == types.MarkupKind.PlainText
    text = hover.contents.value
    assert len(text.splitlines()) < MAX_HOVER_LINES, text
    assert text.startswith(
        "OOM501 torch.load without map_location puts ≈ 25.1 GiB of weights (6.7 B parameters) back on "
        "the GPU it was saved from\n"
    )
    assert 'Quick fix: Pass map_location="cpu" (safe)' in text
    assert URL in text
    # Nothing that only Markdown would render.
    for markup in ("`", "**", "](", "\\_", "#"):
        assert markup not in text.replace(URL, ""), markup
