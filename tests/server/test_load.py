"""The real server over stdio under bursts of edits (issue 28, bounded work under load): a
request whose document changes before it is answered gets ContentModified (-32801) or the
answer for the current text, never nothing; a burst of edits with requests between them costs
one analysis, not one per request; the last diagnostics are the CLI's for the same text.

The analyses are counted from the server's own debug log (`logLevel: debug` sends its
records as window/logMessage: "Analysed <uri> v<N>: ..." once per analysis run).
bench/sustained_edits.py measures the same over 20,000 edits."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server.stdio_client import StdioServer, frame

CONTENT_MODIFIED = -32801
SCRIPT = Path(__file__).resolve().parents[2] / "fixtures" / "cnn_cifar_risky.py"
BURST = 40


def change(uri: str, version: int, line: int, text: str, end: int | None = None) -> dict[str, Any]:
    start = {"line": line, "character": 0}
    stop = {"line": end if end is not None else line, "character": 0}
    return {
        "jsonrpc": "2.0",
        "method": "textDocument/didChange",
        "params": {
            "textDocument": {"uri": uri, "version": version},
            "contentChanges": [{"range": {"start": start, "end": stop}, "text": text}],
        },
    }


def request(msg_id: int, method: str, uri: str, **params: Any) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": msg_id,
        "method": method,
        "params": {"textDocument": {"uri": uri}, **params},
    }


def hover_at(line: int, character: int) -> dict[str, Any]:
    return {"position": {"line": line, "character": character}}


def code_action_at(line: int) -> dict[str, Any]:
    here = {"line": line, "character": 0}
    return {"range": {"start": here, "end": here}, "context": {"diagnostics": []}}


def analyses(server: StdioServer) -> list[str]:
    return [
        message["params"]["message"]
        for message in server.received
        if message.get("method") == "window/logMessage"
        and message["params"]["message"].startswith("Analysed ")
    ]


def cli_findings(folder: Path, name: str, text: str) -> list[tuple[str, int, int]]:
    (folder / name).write_text(text)
    return sorted((f["code"], f["line"], f["column"]) for f in cli_json(folder, name))


def cli_json(folder: Path, name: str) -> list[dict[str, Any]]:
    """`oom-lsp --check --format json` on the file `name` in `folder`: its findings."""
    run = subprocess.run(
        [sys.executable, "-m", "oom_lsp", "--check", "--format", "json", "--no-cache", name],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    return json.loads(run.stdout)


def lsp_findings(items: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    return sorted(
        (d["code"], d["range"]["start"]["line"] + 1, d["range"]["start"]["character"] + 1)
        for d in items
        if d.get("source") == "oom-lsp"
    )


@pytest.fixture(scope="module", params=["vscode-1.139.1", "neovim-0.7.2"])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[StdioServer]:
    """VS Code pulls the diagnostics; Neovim 0.7 has them pushed."""
    root = tmp_path_factory.mktemp("load")
    (root / "pyproject.toml").write_text('[project]\nname = "load"\n')
    running = StdioServer(root, settings={"debounceMs": 0, "logLevel": "debug"})
    running.initialize(request.param)
    yield running
    running.close()


def answer_to(server: StdioServer, msg_id: int, timeout: float = 60) -> dict[str, Any]:
    """The answer to request `msg_id`, perhaps received while waiting for another one."""
    found = next((m for m in server.received if m.get("id") == msg_id and "method" not in m), None)
    return found or server.response(msg_id, timeout)


def last_diagnostics(server: StdioServer, uri: str, version: int) -> list[dict[str, Any]]:
    """The diagnostics of the document's `version`: pulled, or the push of that version
    (perhaps already received while the answers were read)."""
    if server.pulls:
        return server.call("textDocument/diagnostic", {"textDocument": {"uri": uri}}, 60)["result"]["items"]

    def of_version(message: dict[str, Any]) -> bool:
        params = message.get("params") or {}
        return (
            message.get("method") == "textDocument/publishDiagnostics"
            and params.get("uri") == uri
            and params.get("version") == version
        )

    found = next((message for message in server.received if of_version(message)), None)
    return (found or server.wait_for(of_version, 60))["params"]["diagnostics"]


def burst(server: StdioServer, uri: str, first_version: int) -> tuple[bytes, list[int], str]:
    """BURST edits (a comment line inserted at line 10, then removed again, and so on), with a
    hover and a code action after each: one write, as a fast typist's editor sends them. The
    bytes, the request ids, and the text after the burst."""
    text = SCRIPT.read_text()
    lines = text.splitlines(keepends=True)
    messages: list[dict[str, Any]] = []
    ids: list[int] = []
    current = list(lines)
    for index in range(BURST):
        version = first_version + index
        if index % 2 == 0:
            messages.append(change(uri, version, 10, f"# edit {index}\n"))
            current.insert(10, f"# edit {index}\n")
        else:
            messages.append(change(uri, version, 10, "", end=11))
            del current[10]
        for params, method in (
            (hover_at(20, 8), "textDocument/hover"),
            (code_action_at(20), "textDocument/codeAction"),
        ):
            msg_id = server.next_id()
            ids.append(msg_id)
            messages.append(request(msg_id, method, uri, **params))
    # One more edit leaves the text different from the opened one.
    messages.append(change(uri, first_version + BURST, 0, "# the end of the burst\n"))
    current.insert(0, "# the end of the burst\n")
    return b"".join(frame(message) for message in messages), ids, "".join(current)


def test_a_burst_of_edits_costs_one_analysis_and_every_request_is_answered(server: StdioServer) -> None:
    text = SCRIPT.read_text()
    uri = server.open(server.root / "burst.py", text)
    opened = lsp_findings(server.diagnostics(uri, timeout=60))
    assert opened == cli_findings(server.root, "opened.py", text)
    before = len(analyses(server))
    data, ids, final_text = burst(server, uri, first_version=2)
    server.write(data)
    answers = [answer_to(server, msg_id) for msg_id in ids]
    for answer in answers:
        assert "result" in answer or answer["error"]["code"] == CONTENT_MODIFIED, answer
    # The last diagnostics: those of the text after the burst, the CLI's.
    final = lsp_findings(last_diagnostics(server, uri, 2 + BURST))
    assert final == cli_findings(server.root, "final.py", final_text)
    # One analysis for the text after the burst (the server reads the ~30 KB in one to three
    # pieces, and a request that started between two may add one): not one per request
    # (80) or per edit (41).
    during = analyses(server)[before:]
    assert 1 <= len(during) <= 4, during
    assert any(f" v{2 + BURST}:" in line for line in during), during


def test_a_request_for_an_older_version_gets_content_modified_or_the_current_answer(
    server: StdioServer,
) -> None:
    text = SCRIPT.read_text()
    uri = server.open(server.root / "older.py", text)
    server.diagnostics(uri, timeout=60)
    hover_id, action_id, lens_id = server.next_id(), server.next_id(), server.next_id()
    messages = [
        request(hover_id, "textDocument/hover", uri, **hover_at(20, 8)),
        request(action_id, "textDocument/codeAction", uri, **code_action_at(20)),
        request(lens_id, "textDocument/codeLens", uri),
    ]
    # The requests, then at once a burst of edits that ends with the text they were asked on
    # plus a blank line at the top: every line of it moved.
    messages += [
        change(uri, 2 + index, 0, "\n" if index % 2 == 0 else "", end=None if index % 2 == 0 else 1)
        for index in range(9)
    ]
    server.write(b"".join(frame(message) for message in messages))
    current = "\n" + text
    for msg_id, method, params in (
        (hover_id, "textDocument/hover", hover_at(21, 8)),
        (action_id, "textDocument/codeAction", code_action_at(21)),
        (lens_id, "textDocument/codeLens", {}),
    ):
        answer = answer_to(server, msg_id)
        if "error" in answer:
            assert answer["error"]["code"] == CONTENT_MODIFIED, answer
            continue
        # Answered: then it is the answer for the current text.
        again = server.call(method, {"textDocument": {"uri": uri}, **params}, timeout=60)
        assert answer["result"] == again["result"], (answer, again)
    assert lsp_findings(last_diagnostics(server, uri, 10)) == cli_findings(
        server.root, "older_now.py", current
    )


def test_requests_still_in_progress_are_answered_content_modified_at_once(server: StdioServer) -> None:
    """Requests written together with the edit that follows them: the server reads the edit
    before their handlers ran, and answers them ContentModified without analysing."""
    text = SCRIPT.read_text()
    uri = server.open(server.root / "modified.py", text)
    server.diagnostics(uri, timeout=60)
    ids = [server.next_id() for _ in range(5)]
    messages = [request(msg_id, "textDocument/hover", uri, **hover_at(20, 8)) for msg_id in ids]
    messages.append(change(uri, 2, 0, "# typed\n"))
    before = len(analyses(server))
    server.write(b"".join(frame(message) for message in messages))
    answers = [answer_to(server, msg_id) for msg_id in ids]
    assert [answer.get("error", {}).get("code") for answer in answers] == [CONTENT_MODIFIED] * 5, answers
    # The server goes on: the next hover is answered for the new text.
    fresh = server.call("textDocument/hover", {"textDocument": {"uri": uri}, **hover_at(21, 8)}, timeout=60)
    assert "result" in fresh, fresh
    assert len(analyses(server)) - before <= 2
