"""Diagnostics over stdio with real clients' capabilities: push or pull,
positions in the negotiated encoding, syntax errors, odd documents."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from pathlib import Path

import pytest
from lsprotocol import types
from pygls.exceptions import JsonRpcRequestCancelled
from pytest_lsp import LanguageClient

from oom_lsp import checker
from oom_lsp.config import ConfigResolver
from tests import console
from tests.samples import LLAMA_ON_GPU
from tests.server.lsp_session import (
    TIMEOUT_S,
    close_document,
    codes,
    diagnostics_for,
    open_document,
    pulls,
    replace_text,
    wait_for_published,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

# A checkpoint of a CUDA model restored without map_location (OOM501).
RESTORE = LLAMA_ON_GPU + 'net.load_state_dict(state["net"])\n'
LOAD = 'import torch\n\nstate = torch.load("ckpt.pt")\n' + RESTORE
_names = itertools.count()


def new_uri(client: LanguageClient, suffix: str = ".py") -> str:
    return (client.root / f"doc{next(_names)}{suffix}").as_uri()


async def test_capabilities_follow_the_client(client: LanguageClient):
    capabilities = client.init_result.capabilities
    assert (capabilities.diagnostic_provider is not None) == pulls(client)
    assert capabilities.hover_provider
    assert list(capabilities.code_action_provider.code_action_kinds) == [
        "quickfix",
        "refactor.rewrite",
        "source.fixAll.oom-lsp",
        "notebook.source.fixAll.oom-lsp",
    ]
    expected_encoding = "utf-8" if client.client_name == "neovim-0.11.4" else "utf-16"
    assert capabilities.position_encoding == expected_encoding


async def test_risky_file_gets_a_complete_diagnostic(client: LanguageClient):
    uri = new_uri(client)
    since = len(client.published)
    open_document(client, uri, LOAD)
    diagnostics = await diagnostics_for(client, uri, 1, since)
    assert codes(diagnostics) == ["OOM501"]
    (diagnostic,) = diagnostics
    assert diagnostic.source == "oom-lsp"
    assert diagnostic.severity == types.DiagnosticSeverity.Warning
    assert diagnostic.range == types.Range(
        start=types.Position(line=2, character=8), end=types.Position(line=2, character=29)
    )
    assert diagnostic.code_description.href == (
        "https://github.com/oom-lsp/oom-lsp/blob/main/docs/rules.md#torch-load-without-map-location-oom501"
    )
    # The message line, then the quick fix's title as Ruff's server gives it ("help: ..." after a
    # blank line), the same two lines as `oom-lsp check --output-format full`.
    assert diagnostic.message == (
        "torch.load without map_location puts ≈ 25.1 GiB of weights (6.7 B parameters) back on the "
        'GPU it was saved from\n\nhelp: Pass `map_location="cpu"`'
    )
    finding = diagnostic.data["finding"]
    assert finding["code"] == "OOM501" and finding["fix"]["applicability"] == "safe"
    assert diagnostic.data["version"] == 1
    if pulls(client):
        await asyncio.sleep(0.2)
        assert uri not in client.diagnostics, "a pulling client must not be pushed to"


async def test_the_message_has_the_help_line_of_the_clis_full_output(
    client: LanguageClient, tmp_path_factory: pytest.TempPathFactory
):
    """The message line is the CLI's; "help: <the fix's title>" follows where a fix is known, as
    under the code frame of `oom-lsp check --output-format full`; a finding without a fix has none."""
    # OOM602 (DataParallel) has no quick fix.
    text = (Path(__file__).resolve().parents[2] / "fixtures" / "resnet_dataparallel_risky.py").read_text()
    folder = tmp_path_factory.mktemp("help")
    (folder / "pyproject.toml").write_text("[project]\nname = 'help'\n")
    (folder / "train.py").write_text(LOAD)
    full = console.run(["check", "--output-format", "full", "train.py"], cwd=folder, timeout=TIMEOUT_S)
    cli_lines = full.stdout.splitlines()
    uri = new_uri(client)
    since = len(client.published)
    open_document(client, uri, LOAD)
    (diagnostic,) = await diagnostics_for(client, uri, 1, since)
    message, blank, help_line = diagnostic.message.split("\n")
    assert (message, blank) == (cli_lines[0].replace("OOM501 [*] ", ""), "")
    assert help_line.startswith("help: ") and help_line in cli_lines
    unfixable = [d for d in await _diagnostics_of(client, text) if d.data["finding"]["fix"] is None]
    assert unfixable and all("\n" not in d.message and "help:" not in d.message for d in unfixable)


async def _diagnostics_of(client: LanguageClient, text: str) -> list[types.Diagnostic]:
    uri = new_uri(client)
    since = len(client.published)
    open_document(client, uri, text)
    return await diagnostics_for(client, uri, 1, since)


async def test_positions_use_the_negotiated_encoding(client: LanguageClient):
    uri = new_uri(client)
    since = len(client.published)
    open_document(client, uri, 'import torch\nx = "é😀"; state = torch.load("a")\n' + RESTORE)
    (diagnostic,) = await diagnostics_for(client, uri, 1, since)
    # `torch.load` starts at code point 18: é is 2 UTF-8 bytes, 😀 is 4 bytes or 2 UTF-16 units.
    expected = {"utf-8": 22, "utf-16": 19}[client.init_result.capabilities.position_encoding]
    assert diagnostic.range.start == types.Position(line=1, character=expected)


async def test_syntax_error_mid_typing_gives_one_oom000_and_recovers(client: LanguageClient):
    uri = new_uri(client)
    since = len(client.published)
    open_document(client, uri, LOAD)
    assert codes(await diagnostics_for(client, uri, 1, since)) == ["OOM501"]
    replace_text(client, uri, 2, 'import torch\n\nstate = torch.load("ckpt.pt"\n')
    broken = await diagnostics_for(client, uri, 2, since)
    assert codes(broken) == ["OOM000"]
    assert broken[0].severity == types.DiagnosticSeverity.Error
    assert broken[0].message.startswith("SyntaxError")
    replace_text(client, uri, 3, LOAD)
    assert codes(await diagnostics_for(client, uri, 3, since)) == ["OOM501"]


async def test_only_the_last_of_rapid_edits_is_reported(client: LanguageClient):
    uri = new_uri(client)
    since = len(client.published)
    open_document(client, uri, "import torch\n")
    for version in range(2, 12):
        replace_text(
            client,
            uri,
            version,
            "import torch\n" + "x = 1\n" * version + 'state = torch.load("a")\n' + RESTORE,
        )
    (diagnostic,) = await diagnostics_for(client, uri, 11, since)
    assert diagnostic.range.start.line == 12
    if not pulls(client):
        await asyncio.sleep(0.3)
        versions = [params.version for params in client.published[since:] if params.uri == uri]
        assert versions[-1] == 11
        # Each publish is for a version that was current when it was sent.
        assert versions == sorted(versions)


async def test_uris_with_escapes(client: LanguageClient):
    # pygls keys its documents by the unquoted URI; answers use the client's.
    uri = (client.root / f"my training {next(_names)} é.py").as_uri()
    assert "%20" in uri
    since = len(client.published)
    open_document(client, uri, LOAD)
    assert codes(await diagnostics_for(client, uri, 1, since)) == ["OOM501"]
    hover = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=2, character=12)
        )
    )
    assert hover is not None


async def test_untitled_document(client: LanguageClient):
    uri = f"untitled:Untitled-{next(_names)}"
    since = len(client.published)
    open_document(client, uri, LOAD)
    assert codes(await diagnostics_for(client, uri, 1, since)) == ["OOM501"]


async def test_files_without_torch_are_clean_and_close_clears(client: LanguageClient):
    uri = new_uri(client)
    since = len(client.published)
    open_document(client, uri, "print('hello')\n")
    assert await diagnostics_for(client, uri, 1, since) == []
    risky = new_uri(client)
    open_document(client, risky, LOAD)
    assert codes(await diagnostics_for(client, risky, 1, since)) == ["OOM501"]
    close_document(client, risky)
    if not pulls(client):
        cleared = await wait_for_published(client, risky, None, since)
        assert list(cleared.diagnostics) == []


async def test_requests_about_unknown_or_closed_documents_are_answered(client: LanguageClient):
    uri = new_uri(client)
    position = types.Position(line=0, character=0)
    hover = await client.text_document_hover_async(
        types.HoverParams(text_document=types.TextDocumentIdentifier(uri=uri), position=position)
    )
    assert hover is None
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=types.Range(start=position, end=position),
            context=types.CodeActionContext(diagnostics=[]),
        )
    )
    assert actions is None
    if pulls(client):
        report = await client.text_document_diagnostic_async(
            types.DocumentDiagnosticParams(text_document=types.TextDocumentIdentifier(uri=uri))
        )
        assert list(report.items) == []


async def test_large_and_binary_documents_are_answered(client: LanguageClient):
    big = new_uri(client)
    since = len(client.published)
    body = "".join(
        f"def step_{index}(model, batch):\n    return model(batch) * {index}\n\n" for index in range(6667)
    )
    open_document(client, big, "import torch\n" + body + 'state = torch.load("ckpt.pt")\n' + RESTORE)
    diagnostics = await diagnostics_for(client, big, 1, since)
    assert codes(diagnostics) == ["OOM501"]
    assert diagnostics[0].range.start.line == 20002
    binary = new_uri(client, ".bin.py")
    open_document(client, binary, "torch\x00\x01\x02\xff\ufffd\x1b[0m\x0c\u2028garbage torch.load(\n")
    answered = await diagnostics_for(client, binary, 1, since)
    assert codes(answered) == ["OOM000"]


async def test_a_cancelled_request_leaves_the_server_serving(client: LanguageClient):
    uri = new_uri(client)
    since = len(client.published)
    open_document(client, uri, LOAD)
    position = types.Position(line=2, character=12)
    params = types.HoverParams(text_document=types.TextDocumentIdentifier(uri=uri), position=position)
    request_id = f"to-cancel-{next(_names)}"
    pending = client.protocol.send_request(types.TEXT_DOCUMENT_HOVER, params, msg_id=request_id)
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id=request_id))
    # Cancelled before it finished, or finished first: both are fine.
    with contextlib.suppress(JsonRpcRequestCancelled):
        await asyncio.wait_for(asyncio.wrap_future(pending), TIMEOUT_S)
    await diagnostics_for(client, uri, 1, since)
    hover = await client.text_document_hover_async(params)
    assert hover is not None and "OOM501" in hover.contents.value


async def test_files_the_configuration_excludes_get_no_diagnostics(client: LanguageClient):
    # `venv` is in the default `exclude`: sources opened by go-to-definition stay quiet.
    uri = (client.root / "venv" / "lib" / f"vendored{next(_names)}.py").as_uri()
    since = len(client.published)
    open_document(client, uri, LOAD)
    assert await diagnostics_for(client, uri, 1, since) == []


async def test_incremental_edits_after_a_form_feed_line(client: LanguageClient):
    # Emacs page breaks: str.splitlines (pygls' line split) would count an
    # extra line here and apply the client's edit one line too high.
    uri = new_uri(client)
    since = len(client.published)
    text = "import torch\n\x0c\nstate = torch.load('a')\n" + RESTORE
    open_document(client, uri, text)
    assert codes(await diagnostics_for(client, uri, 1, since)) == ["OOM501"]
    at = types.Position(line=2, character=len("state = torch.load('a'"))
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(start=at, end=at), text=", map_location='cpu'"
                )
            ],
        )
    )
    assert await diagnostics_for(client, uri, 2, since) == []


@pytest.mark.parametrize(
    "text",
    [
        'import torch\nx = 1\ny = "a\x00b"\nstate = torch.load("ckpt.pt")\n',
        'import torch\nx = 1\ns = "abc\ny = 2\n',
        'import torch\nx = 1\ns = """abc\n\ny = 2\n',
        "import torch\nif x:\n        a = 1\n    b = 2\n",
    ],
    ids=["nul byte", "unterminated string", "unterminated triple quote", "bad dedent"],
)
async def test_the_editor_says_what_the_cli_says_about_text_python_rejects(
    client: LanguageClient, text: str, tmp_path_factory: pytest.TempPathFactory
):
    folder = tmp_path_factory.mktemp("rejected")
    (folder / "train.py").write_text(text)
    cli = checker.check_files([folder / "train.py"], ConfigResolver(fallback_root=folder), use_cache=False)
    expected = [(f.code, f.line - 1, f.column, f.message) for f in cli.results[0].findings]
    assert expected and expected[0][1:3] != (0, 0)  # not at 1:1
    uri = new_uri(client)
    since = len(client.published)
    open_document(client, uri, text)
    diagnostics = await diagnostics_for(client, uri, 1, since)
    assert [(d.code, d.range.start.line, d.range.start.character, d.message) for d in diagnostics] == expected


async def test_a_document_over_max_file_size_is_reported_not_analysed(client: LanguageClient):
    folder = client.root / f"limited{next(_names)}"
    folder.mkdir()
    (folder / "pyproject.toml").write_text('[tool.oom-lsp]\nmax-file-size = "4KiB"\n')
    uri = (folder / "big.py").as_uri()
    since = len(client.published)
    open_document(client, uri, LOAD + "x = 1\n" * 2000)
    (diagnostic,) = await diagnostics_for(client, uri, 1, since)
    assert diagnostic.code is None and diagnostic.severity == types.DiagnosticSeverity.Warning
    assert diagnostic.message == (
        "oom-lsp not checked: 11.9 KiB is over max-file-size (4 KiB); raise max-file-size in "
        "[tool.oom-lsp] to check it"
    )


async def test_a_big_document_does_not_hold_up_the_others(client: LanguageClient):
    """Its analysis takes seconds: a small document opened after it is answered first."""
    big, small = new_uri(client), new_uri(client)
    body = "".join(f"def step_{n}(model, batch):\n    return model(batch) * {n}\n\n" for n in range(6000))
    since = len(client.published)
    order: list[str] = []

    async def diagnostics(uri: str, name: str) -> None:
        await diagnostics_for(client, uri, 1, since)
        order.append(name)

    open_document(client, big, "import torch\n" + body + 'state = torch.load("ckpt.pt")\n')
    waiting_big = asyncio.ensure_future(diagnostics(big, "big"))
    await asyncio.sleep(0.2)  # the big one's analysis has started
    open_document(client, small, LOAD)
    await asyncio.gather(waiting_big, diagnostics(small, "small"))
    assert order == ["small", "big"]
