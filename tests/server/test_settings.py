"""Settings: initializationOptions, workspace/configuration (when the client
has it), didChangeConfiguration, and pyproject.toml changes without restart."""

from __future__ import annotations

import asyncio

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.samples import LLAMA_ON_GPU
from tests.server.lsp_session import (
    CLIENTS,
    CONFIG,
    TIMEOUT_S,
    diagnostics_for,
    open_document,
    pulls,
    replace_text,
    start_session,
    wait_for_published,
)

pytestmark = pytest.mark.asyncio(loop_scope="module")

# A checkpoint of a CUDA model restored without map_location (OOM501).
LOAD = 'import torch\n\nstate = torch.load("ckpt.pt")\n' + LLAMA_ON_GPU + 'net.load_state_dict(state["net"])\n'


@pytest_lsp.fixture(scope="module", params=list(CLIENTS), config=CONFIG)
async def client(
    request: pytest.FixtureRequest, lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory
):
    root = tmp_path_factory.mktemp("settings")
    lsp_client.root = root
    lsp_client.client_name = request.param
    lsp_client.init_result = await start_session(
        lsp_client,
        request.param,
        root,
        initialization_options={"settings": {"ignore": ["OOM501"], "debounceMs": 0}},
        configuration={"debounceMs": 0},
    )
    lsp_client.uri = (root / "train.py").as_uri()
    yield
    await lsp_client.shutdown_session()


def _has_configuration(client: LanguageClient) -> bool:
    return bool(client.capabilities.workspace.configuration)


async def test_configuration_answer_wins_over_initialization_options(client: LanguageClient):
    open_document(client, client.uri, LOAD)
    diagnostics = await diagnostics_for(client, client.uri, 1)
    # The workspace/configuration answer selects the defaults; a client that
    # cannot answer it has only the initializationOptions, which ignore OOM501.
    expected = ["OOM501"] if _has_configuration(client) else []
    assert [d.code for d in diagnostics] == expected


async def test_did_change_configuration_rechecks_open_documents(client: LanguageClient):
    new_settings = {"severity": {"OOM501": "error"}, "debounceMs": 0}
    client.set_configuration(new_settings, section="oomLsp")
    since = len(client.published)
    refreshes = client.diagnostic_refresh_count
    logs = len(client.log_messages)
    client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"oomLsp": new_settings})
    )
    if pulls(client):
        deadline = asyncio.get_running_loop().time() + TIMEOUT_S
        if client.capabilities.workspace.diagnostics:
            while client.diagnostic_refresh_count == refreshes:
                assert asyncio.get_running_loop().time() < deadline, "no workspace/diagnostic/refresh"
                await asyncio.sleep(0.02)
        else:
            # Nothing tells such a client to pull again: it pulls on its next edit.
            while not any("Settings changed" in m.message for m in client.log_messages[logs:]):
                assert asyncio.get_running_loop().time() < deadline, "settings change not applied"
                await asyncio.sleep(0.02)
        diagnostics = await diagnostics_for(client, client.uri, 1)
    else:
        diagnostics = list((await wait_for_published(client, client.uri, 1, since)).diagnostics)
    assert [(d.code, d.severity) for d in diagnostics] == [("OOM501", types.DiagnosticSeverity.Error)]


async def test_pyproject_change_is_picked_up_without_restart(client: LanguageClient):
    pyproject = client.root / "pyproject.toml"
    pyproject.write_text('[tool.oom-lsp]\nignore = ["OOM501"]\n')
    since = len(client.published)
    registrations = getattr(client, "registrations", [])
    watched = client.capabilities.workspace.did_change_watched_files
    if watched and watched.dynamic_registration:
        (registration,) = [r for r in registrations if r.method == types.WORKSPACE_DID_CHANGE_WATCHED_FILES]
        globs = [watcher["globPattern"] for watcher in registration.register_options["watchers"]]
        assert "**/pyproject.toml" in globs
        client.workspace_did_change_watched_files(
            types.DidChangeWatchedFilesParams(
                changes=[types.FileEvent(uri=pyproject.as_uri(), type=types.FileChangeType.Created)]
            )
        )
        version = 1
    else:
        # No file watching: the config file's mtime is checked before analysing.
        assert registrations == []
        replace_text(client, client.uri, 2, LOAD)
        version = 2
    if pulls(client):
        await asyncio.sleep(0.1)  # let the notification land before pulling
    assert await diagnostics_for(client, client.uri, version, since) == []
    pyproject.write_text("[tool.oom-lsp]\nmax-batch-size = 64\n")
    since = len(client.published)
    replace_text(client, client.uri, version + 1, LOAD)
    assert [d.code for d in await diagnostics_for(client, client.uri, version + 1, since)] == ["OOM501"]


async def test_a_broken_pyproject_is_reported_once_and_checking_goes_on(client: LanguageClient):
    pyproject = client.root / "pyproject.toml"
    pyproject.write_text('[tool.oom-lsp]\nmax-batch-size = "big"\n')
    errors_before = len([m for m in client.messages if m.type == types.MessageType.Error])
    for version in (10, 11):
        since = len(client.published)
        replace_text(client, client.uri, version, LOAD)
        diagnostics = await diagnostics_for(client, client.uri, version, since)
        # The editor settings apply meanwhile.
        assert [d.code for d in diagnostics] == ["OOM501"]
    errors = [m for m in client.messages if m.type == types.MessageType.Error][errors_before:]
    assert len(errors) == 1
    assert "pyproject.toml" in errors[0].message and "max-batch-size" in errors[0].message


@pytest_lsp.fixture(scope="module", config=CONFIG)
async def flat_client(lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("flat")
    lsp_client.root = root
    lsp_client.log_path = root / "oom-lsp.log"
    # Neovim 0.7.2 cannot answer workspace/configuration: only these count.
    lsp_client.init_result = await start_session(
        lsp_client,
        "neovim-0.7.2",
        root,
        initialization_options={
            "ignore": ["OOM501"],
            "logFile": str(lsp_client.log_path),
            "logLevel": "debug",
            # Long enough that a loaded machine still sends every edit inside it.
            "debounceMs": 500,
        },
    )
    yield
    await lsp_client.shutdown_session()


async def test_flat_initialization_options_and_log_file(flat_client: LanguageClient):
    uri = (flat_client.root / "train.py").as_uri()
    open_document(flat_client, uri, LOAD)
    assert await diagnostics_for(flat_client, uri, 1) == []
    log = flat_client.log_path.read_text()
    assert "push diagnostics" in log
    # At debug level the file gets pygls' message log; the client never does.
    assert "textDocument/didOpen" in log
    assert "train.py v1: 0 findings in" in log
    assert not any("Sending data" in message.message for message in flat_client.log_messages)


async def test_debounce_publishes_only_the_last_of_quick_edits(flat_client: LanguageClient):
    uri = (flat_client.root / "typing.py").as_uri()
    since = len(flat_client.published)
    open_document(flat_client, uri, "import torch\n")
    await wait_for_published(flat_client, uri, 1, since)
    for version in range(2, 7):
        replace_text(flat_client, uri, version, "import torch\n" + "x = 1\n" * version)
    await wait_for_published(flat_client, uri, 6, since)
    versions = [params.version for params in flat_client.published[since:] if params.uri == uri]
    assert versions == [1, 6]


async def test_an_invalid_setting_is_reported_and_the_others_kept(flat_client: LanguageClient):
    uri = (flat_client.root / "train.py").as_uri()
    since = len(flat_client.published)
    settings = {"maxBatchSiz": 3, "severity": {"OOM501": "error"}, "debounceMs": 0}
    flat_client.workspace_did_change_configuration(
        types.DidChangeConfigurationParams(settings={"oomLsp": settings})
    )
    republished = await wait_for_published(flat_client, uri, 1, since)
    # The earlier `ignore` is gone with the old settings; `severity` survived the typo next to it.
    assert [(d.code, d.severity) for d in republished.diagnostics] == [
        ("OOM501", types.DiagnosticSeverity.Error)
    ]
    (error,) = [m for m in flat_client.messages if m.type == types.MessageType.Error]
    assert error.message.startswith("oom-lsp: Ignoring oomLsp.maxBatchSiz: ")
    assert "did you mean" in error.message
