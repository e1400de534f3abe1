"""Hover: the rule's docs on a diagnostic and on a code in a suppression comment."""

from __future__ import annotations

import itertools

import pytest
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.server.lsp_session import diagnostics_for, open_document

pytestmark = pytest.mark.asyncio(loop_scope="module")

_names = itertools.count()
TEXT = (
    "import torch\n"
    "\n"
    'state = torch.load("ckpt.pt")\n'
    'other = torch.load("b.pt", map_location="cpu")  # oom: ignore[OOM301, torch-load-without-map-location]\n'
    "value = 1  # noqa: E501, OOM501\n"
    'net.cuda().load_state_dict(state["net"])\n'
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


async def test_hover_on_a_diagnostic_shows_the_rule_docs(client: LanguageClient, document: str):
    hover = await _hover(client, document, 2, 14)
    assert hover is not None
    assert hover.contents.kind == types.MarkupKind.Markdown
    assert hover.contents.value.startswith("# torch-load-without-map-location (OOM501)")
    assert "## Why is this bad?" in hover.contents.value
    assert hover.range == types.Range(
        start=types.Position(line=2, character=8), end=types.Position(line=2, character=29)
    )


async def test_hover_on_codes_inside_suppression_comments(client: LanguageClient, document: str):
    line_3 = TEXT.splitlines()[3]
    by_name = await _hover(client, document, 3, line_3.index("torch-load-without") + 3)
    assert by_name is not None and "(OOM501)" in by_name.contents.value
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
