"""A real oom-lsp server per test module and client (spawning one costs ~3 s)."""

from __future__ import annotations

import pytest
import pytest_lsp
from pytest_lsp import LanguageClient

from tests.server.lsp_session import CLIENTS, CONFIG, start_session


@pytest_lsp.fixture(scope="module", params=list(CLIENTS), config=CONFIG)
async def client(
    request: pytest.FixtureRequest, lsp_client: LanguageClient, tmp_path_factory: pytest.TempPathFactory
):
    root = tmp_path_factory.mktemp("workspace")
    lsp_client.root = root
    lsp_client.client_name = request.param
    lsp_client.init_result = await start_session(
        lsp_client,
        request.param,
        root,
        # Immediate checks keep the tests fast; the debounce has its own test.
        initialization_options={"settings": {"debounceMs": 0}},
        configuration={"debounceMs": 0},
    )
    yield
    await lsp_client.shutdown_session()
