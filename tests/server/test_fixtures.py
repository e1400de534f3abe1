"""The repository's training-script fixtures through the server: diagnostics
are the analysis of the text (every rule, converted to the client's position
encoding), and fix-all gives what `fix_source` gives."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from oom_lsp.analysis import analyze, default_settings
from oom_lsp.analysis.autofix import FixResult, fix_source
from oom_lsp.analysis.rule import MESSAGE_LIMIT
from oom_lsp.server.positions import PositionConverter
from tests.server.lsp_session import (
    CONFIG,
    apply_text_edits,
    diagnostics_for,
    edits_of,
    open_document,
    start_session,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

FIXTURES = sorted((Path(__file__).parent.parent.parent / "fixtures").glob("*.py"))


# Two clients cover pull (VS Code) and push (Neovim 0.7); every rule runs on
# every fixture, so more would only repeat the same analysis.
@pytest_lsp.fixture(scope="module", params=["vscode-1.139.1", "neovim-0.7.2"], config=CONFIG)
async def client(
    request: pytest.FixtureRequest, lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory
):
    root = tmp_path_factory.mktemp("fixtures")
    lsp_client.root = root
    lsp_client.init_result = await start_session(
        lsp_client, request.param, root, initialization_options={"debounceMs": 0}
    )
    yield
    await lsp_client.shutdown_session()


@functools.cache
def _fixed(fixture: Path) -> FixResult:
    return fix_source(fixture.read_text(), default_settings(), path=str(fixture))


@pytest.mark.parametrize("fixture", FIXTURES, ids=[path.name for path in FIXTURES])
async def test_fixture_diagnostics_and_fix_all(client: LanguageClient, fixture: Path):
    text = fixture.read_text()
    encoding = client.init_result.capabilities.position_encoding
    uri = (client.root / fixture.name).as_uri()
    since = len(client.published)
    open_document(client, uri, text)
    diagnostics = await diagnostics_for(client, uri, 1, since)
    converter = PositionConverter(text, encoding)
    findings = analyze(text, default_settings(), str(fixture))
    # The message line is the finding's; a fix's title follows as Ruff's "help: ..." line.
    assert [(str(d.code), d.range, d.message) for d in diagnostics] == [
        (
            finding.code,
            converter.range_to_lsp(finding.range),
            finding.message + (f"\n\nhelp: {finding.fix.title}" if finding.fix else ""),
        )
        for finding in findings
    ]
    # What the Problems panel and Neovim's float show whole, line by line (tests/analysis/test_messages.py).
    lines = [line for d in diagnostics for line in d.message.split("\n")]
    assert [line for line in lines if len(line) >= MESSAGE_LIMIT] == []
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(
                start=types.Position(line=0, character=0), end=types.Position(line=0, character=0)
            ),
            context=types.CodeActionContext(diagnostics=[], only=["source.fixAll.oom-lsp"]),
        )
    )
    expected = _fixed(fixture)
    if expected.applied == 0:
        assert not actions
    else:
        (fix_all,) = actions
        assert apply_text_edits(text, edits_of(fix_all, uri), encoding) == expected.source
    client.text_document_did_close(
        types.DidCloseTextDocumentParams(text_document=types.TextDocumentIdentifier(uri=uri))
    )
