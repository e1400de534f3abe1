"""Random edits (insertions, deletions, garbage) sent as didChange to the real
server: every request is answered, and every diagnostic published is the
analysis of the version it claims (stale results are never published)."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import pytest_lsp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lsprotocol import types
from pytest_lsp import LanguageClient

from oom_lsp.analysis import default_settings
from oom_lsp.checker import analyze_text
from oom_lsp.server.positions import PositionConverter
from tests.server.lsp_session import CONFIG, TIMEOUT_S, diagnostics_for, open_document, pulls, start_session

pytestmark = pytest.mark.asyncio(loop_scope="module")

SEED = (
    "import torch\n"
    "from torch.utils.data import DataLoader\n"
    "\n"
    "def train(model, loader, optimizer):\n"
    "    for batch in loader:\n"
    "        loss = model(batch).mean()\n"
    "        loss.backward()\n"
    "        optimizer.step()\n"
    '    state = torch.load("ckpt.pt")\n'
    "    return state\n"
)
_names = itertools.count()


@st.composite
def edit(draw: st.DrawFn, length: int) -> tuple[int, int, str]:
    """(start, end, replacement) on a text of `length` code points. Lone
    `\\r`, form feeds and U+2028 test that both sides agree on the lines."""
    start = draw(st.integers(0, length))
    kind = draw(st.sampled_from(["insert", "delete", "replace", "garbage"]))
    end = start if kind in ("insert", "garbage") else draw(st.integers(start, min(length, start + 40)))
    if kind == "garbage":
        raw = draw(st.binary(min_size=1, max_size=16))
        return start, end, raw.decode("latin-1")
    text = draw(
        st.text(alphabet=st.sampled_from(list("torch.load()[]:,= \n\t\"'#x1é😀\r\x0c\u2028")), max_size=20)
        | st.sampled_from(['torch.load("a")\n', "    ", "def f(:\n", "(", '"""', "\\\n", "for x in y:\n"])
    )
    return start, end, text


def _not_inside_crlf(text: str, offset: int) -> int:
    """An LSP position cannot point between the two characters of `\\r\\n`."""
    return offset - 1 if 0 < offset < len(text) and text[offset - 1 : offset + 1] == "\r\n" else offset


@st.composite
def edit_sequence(draw: st.DrawFn) -> list[tuple[int, int, str, str]]:
    """Successive edits: (start, end, replacement) on the previous text, and
    the text after it."""
    edits = []
    current = SEED
    for _ in range(draw(st.integers(1, 6))):
        start, end, replacement = draw(edit(len(current)))
        start, end = _not_inside_crlf(current, start), _not_inside_crlf(current, end)
        current = current[:start] + replacement + current[end:]
        edits.append((start, end, replacement, current))
    return edits


@pytest_lsp.fixture(scope="module", params=["vscode-1.139.1", "neovim-0.7.2"], config=CONFIG)
async def client(
    request: pytest.FixtureRequest, lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory
):
    root = tmp_path_factory.mktemp("fuzz")
    lsp_client.root = root
    # A real debounce: superseded versions must be dropped, not published late.
    lsp_client.init_result = await start_session(
        lsp_client,
        request.param,
        root,
        initialization_options={"debounceMs": 10},
        configuration={"debounceMs": 10},
    )
    yield
    await lsp_client.shutdown_session()


def _expected(text: str, encoding: str) -> list[tuple[str, types.Range]]:
    converter = PositionConverter(text, encoding)
    return [
        (finding.code, converter.range_to_lsp(finding.range))
        for finding in analyze_text(text, default_settings(), "<stdin>")
    ]


def _got(diagnostics: list[types.Diagnostic]) -> list[tuple[str, types.Range]]:
    return [(str(diagnostic.code), diagnostic.range) for diagnostic in diagnostics]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edits=edit_sequence())
async def test_random_edits(client: LanguageClient, edits: list[tuple[int, int, str, str]]):
    encoding = client.init_result.capabilities.position_encoding
    uri = (client.root / f"fuzz{next(_names)}.py").as_uri()
    since = len(client.published)
    open_document(client, uri, SEED)
    versions = {1: SEED}
    texts = [SEED]
    for version, (start, end, replacement, text) in enumerate(edits, start=2):
        # Incremental changes, positions in the negotiated encoding.
        before = PositionConverter(versions[version - 1], encoding)
        change = types.TextDocumentContentChangePartial(
            range=types.Range(
                start=before.offset_to_lsp(start, versions[version - 1]),
                end=before.offset_to_lsp(end, versions[version - 1]),
            ),
            text=replacement,
        )
        versions[version] = text
        texts.append(text)
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[change],
            )
        )
    last = max(versions)
    identifier = types.TextDocumentIdentifier(uri=uri)
    end_of_text = PositionConverter(texts[-1], encoding).end()
    everything = types.Range(start=types.Position(line=0, character=0), end=end_of_text)
    hover, actions = await asyncio.wait_for(
        asyncio.gather(
            client.text_document_hover_async(
                types.HoverParams(text_document=identifier, position=end_of_text)
            ),
            client.text_document_code_action_async(
                types.CodeActionParams(
                    text_document=identifier,
                    range=everything,
                    context=types.CodeActionContext(diagnostics=[], only=["source.fixAll"]),
                )
            ),
        ),
        TIMEOUT_S,
    )
    assert hover is None or hover.contents.value.startswith("**OOM")  # a finding's hover: its code first
    assert actions is not None
    diagnostics = await diagnostics_for(client, uri, last, since)
    assert _got(diagnostics) == _expected(texts[-1], encoding)
    if not pulls(client):
        for params in client.published[since:]:
            if params.uri == uri:
                assert params.version in versions
                assert _got(list(params.diagnostics)) == _expected(versions[params.version], encoding)
    client.text_document_did_close(types.DidCloseTextDocumentParams(text_document=identifier))
