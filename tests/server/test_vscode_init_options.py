"""The VS Code extension's settings payload, replayed against the real server.

`vscode-client/test/settings.test.ts` builds the `initializationOptions` from a
user's settings with the extension's own code and writes them to
`fixtures/vscode_initialization_options.json`; the extension answers
`workspace/configuration` with the same `settings` object. Here a client with
VS Code 1.139.1's captured capabilities sends that payload both ways, and the
diagnostics show the server applied every key (and rejected none: the server
drops all editor settings when one key is unknown), so the two sides cannot
drift apart.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from oom_lsp.server.settings import parse_editor_settings
from tests.server.lsp_session import CONFIG, diagnostics_for, open_document, start_session

pytestmark = pytest.mark.asyncio(loop_scope="module")

PAYLOAD = json.loads((Path(__file__).parent / "fixtures" / "vscode_initialization_options.json").read_text())
VSCODE = "vscode-1.139.1"

SOURCE = """\
import torch
from torch.utils.data import DataLoader

small = DataLoader(range(10), batch_size=48)
large = DataLoader(range(10), batch_size=128)
state = torch.load("ckpt.pt")
x = torch.zeros(4096, 4096, dtype=torch.float64, device="cuda")
y = 1  # oom: ignore[OOM501]
model.load_state_dict(state["model"])
"""


@pytest_lsp.fixture(
    scope="module", params=["workspace/configuration", "initializationOptions"], config=CONFIG
)
async def client(
    request: pytest.FixtureRequest, lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory
):
    root = tmp_path_factory.mktemp("vscode")
    lsp_client.root = root
    # The extension answers workspace/configuration with the same settings; left
    # unanswered, the server keeps the initializationOptions alone.
    configuration = PAYLOAD["settings"] if request.param == "workspace/configuration" else None
    lsp_client.init_result = await start_session(
        lsp_client, VSCODE, root, initialization_options=PAYLOAD, configuration=configuration
    )
    yield
    await lsp_client.shutdown_session()


async def test_the_payload_is_what_the_extension_test_wrote():
    # Extension-only settings (path, interpreter, profile.entryPoint, trace) never reach the server;
    # what its commands read does, so that a lens (which sends the file alone) uses them.
    assert set(PAYLOAD) == {"settings"}
    assert not {"path", "interpreter", "trace"} & set(PAYLOAD["settings"])
    commands = parse_editor_settings(PAYLOAD["settings"]).commands
    assert commands == {"gpu": "RTX 3090", "worldSize": 2, "profile": {"steps": 2, "args": ["--epochs", "1"]}}


async def _diagnostics(
    client: LanguageClient, relative: str
) -> list[tuple[str, int, types.DiagnosticSeverity]]:
    path = client.root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(SOURCE)
    open_document(client, path.as_uri(), SOURCE)
    diagnostics = await diagnostics_for(client, path.as_uri(), 1)
    return sorted((str(d.code), d.range.start.line + 1, d.severity) for d in diagnostics)


async def test_every_setting_is_applied(client: LanguageClient):
    assert await _diagnostics(client, "train.py") == [
        # extendSelect OOM101 (off by default), maxBatchSize 64: 48 is fine,
        # 128 is not; severity OOM101 -> hint.
        ("OOM101", 5, types.DiagnosticSeverity.Hint),
        # severity OOM5 -> error.
        ("OOM501", 6, types.DiagnosticSeverity.Error),
        # extendSelect OOM900: the suppression on line 8 suppresses nothing.
        ("OOM900", 8, types.DiagnosticSeverity.Warning),
        # ignore OOM202: the float64 tensor on line 7 is not reported.
    ]


async def test_per_file_ignores_and_exclude_are_applied(client: LanguageClient):
    codes = [code for code, _, _ in await _diagnostics(client, "tests/test_train.py")]
    assert codes == ["OOM501", "OOM900"]
    assert await _diagnostics(client, "scratch/try.py") == []


async def test_no_setting_was_rejected(client: LanguageClient):
    errors = [message.message for message in client.messages if message.type == types.MessageType.Error]
    assert errors == []
