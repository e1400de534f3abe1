"""VS Code's Restricted Mode, as the server sees it (`workspaceTrusted: false` in the
settings the extension sends): no lens and no command that runs the workspace's code, until
the user trusts the workspace; then the lenses come back (workspace/codeLens/refresh).
Diagnostics, hovers and quick fixes work either way."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.server.stdio_client import StdioServer

SCRIPT = textwrap.dedent(
    """\
    import torch

    open({marker!r}, "w").write("ran")


    def train(model, loader, optimizer):
        total = 0
        for x, y in loader:
            loss = model(x).sum()
            loss.backward()
            optimizer.step()
            total += loss


    if __name__ == "__main__":
        train(*build())
    """
)
RUNS_CODE = ("oom-lsp.estimate", "oom-lsp.whatIf", "oom-lsp.profile", "oom-lsp.validateFix")


@pytest.fixture
def restricted(tmp_path: Path):
    workspace = tmp_path / "clone"
    workspace.mkdir()
    marker = tmp_path / "ran"
    script = workspace / "train.py"
    script.write_text(SCRIPT.format(marker=str(marker)))
    server = StdioServer(workspace, settings={"debounceMs": 0, "workspaceTrusted": False})
    try:
        server.initialize()
        uri = server.open(script, script.read_text())
        yield server, uri, marker
    finally:
        server.close()


def _lenses(server: StdioServer, uri: str) -> list[str]:
    answer = server.call("textDocument/codeLens", {"textDocument": {"uri": uri}})
    return sorted(lens["command"]["command"] for lens in answer["result"])


def test_restricted_mode_offers_nothing_that_runs_the_workspace_and_trust_brings_it_back(restricted):
    server, uri, marker = restricted
    # The analysis is the same.
    assert [d["code"] for d in server.diagnostics(uri)] == ["OOM301"]
    assert _lenses(server, uri) == []
    for command in RUNS_CODE:
        answer = server.call("workspace/executeCommand", {"command": command, "arguments": [{"uri": uri}]})
        assert answer["error"]["code"] == -32803, answer
        assert "the workspace is not trusted" in answer["error"]["message"], answer
    assert not marker.exists()

    # The user trusts the workspace: the extension sends its settings again, without the flag.
    server.settings = {"debounceMs": 0}
    server.notify("workspace/didChangeConfiguration", {"settings": None})
    server.wait_for(lambda message: message.get("method") == "workspace/codeLens/refresh")
    lenses = _lenses(server, uri)
    assert lenses == sorted(["oom-lsp.estimate", "oom-lsp.profile", "oom-lsp.whatIf"] * 2)
    assert server.call("shutdown")["result"] is None
    server.notify("exit")
    assert server.exit_code() == 0
    assert not marker.exists()


def test_a_wrong_value_is_not_trust(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT.format(marker=str(tmp_path / "ran")))
    server = StdioServer(tmp_path, settings={"debounceMs": 0, "workspaceTrusted": "yes"})
    try:
        server.initialize()
        uri = server.open(script, script.read_text())
        assert _lenses(server, uri) == []
        shown = server.wait_for(lambda message: message.get("method") == "window/showMessage")
        assert "oomLsp.workspaceTrusted: expected true or false, got 'yes'" in shown["params"]["message"]
    finally:
        server.close()
