"""The real server over stdio, fed what careless or hostile clients send: broken framing,
malformed JSON, params that do not fit the schema, wrong-typed command arguments. Every
request is answered (a result or a JSON-RPC error, never an internal error for bad
input), and the server keeps answering afterwards. Bounded: one server, ~40 s in CI."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.samples import LLAMA_ON_GPU
from tests.server.stdio_client import StdioServer, frame

LOAD = 'import torch\n\nstate = torch.load("ckpt.pt")\n' + LLAMA_ON_GPU + "net.load_state_dict(state)\n"
PARSE_ERROR, INVALID_REQUEST, METHOD_NOT_FOUND, INVALID_PARAMS, INTERNAL_ERROR = (
    -32700,
    -32600,
    -32601,
    -32602,
    -32603,
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StdioServer]:
    root = tmp_path_factory.mktemp("abuse")
    (root / "train.py").write_text(LOAD)
    running = StdioServer(root, settings={"debounceMs": 0})
    running.initialize()
    running.uri = running.open(root / "train.py", LOAD)
    yield running
    running.close()


def hover(server: StdioServer, msg_id: int) -> dict:
    return {
        "jsonrpc": "2.0",
        "id": msg_id,
        "method": "textDocument/hover",
        "params": {"textDocument": {"uri": server.uri}, "position": {"line": 2, "character": 12}},
    }


def body(message: dict) -> bytes:
    return json.dumps(message).encode()


def assert_still_answers(server: StdioServer, count: int = 8) -> None:
    ids = [server.next_id() for _ in range(count)]
    server.write(b"".join(frame(hover(server, msg_id)) for msg_id in ids))
    for msg_id in ids:
        answer = server.response(msg_id)
        assert "OOM501" in answer["result"]["contents"]["value"], answer


FRAMING = {
    "a Content-Length too short": lambda m: b"Content-Length: %d\r\n\r\n" % (len(body(m)) - 7) + body(m),
    "a Content-Length too long": lambda m: b"Content-Length: %d\r\n\r\n" % (len(body(m)) + 25) + body(m),
    "a lower-case header": lambda m: b"content-length: %d\r\n\r\n" % len(body(m)) + body(m),
    "LF-only header lines": lambda m: b"Content-Length: %d\n\n" % len(body(m)) + body(m),
    "a Content-Type first": lambda m: (
        b"Content-Type: application/vscode-jsonrpc; charset=utf-8\r\n" + frame(m)
    ),
    "garbage before it": lambda m: b"\x00\xffnot a header\r\n}{\r\n" + frame(m),
}


@pytest.mark.parametrize("damage", list(FRAMING))
def test_a_damaged_frame_is_read_and_the_server_stays_in_sync(server: StdioServer, damage: str):
    msg_id = server.next_id()
    server.write(FRAMING[damage](hover(server, msg_id)))
    assert "OOM501" in server.response(msg_id)["result"]["contents"]["value"]
    assert_still_answers(server)


def test_a_length_too_long_with_nothing_after_it_is_read_when_the_input_stalls(server: StdioServer):
    msg_id = server.next_id()
    message = body(hover(server, msg_id))
    server.write(b"Content-Length: %d\r\n\r\n" % (len(message) + 100) + message)
    assert "OOM501" in server.response(msg_id, timeout=15)["result"]["contents"]["value"]
    assert_still_answers(server)


def test_headers_without_a_length_and_an_oversized_length_are_skipped(server: StdioServer):
    server.write(b"Content-Type: text/plain\r\n\r\n" + body(hover(server, 9001)))
    server.write(b"Content-Length: 99999999999999\r\n\r\n" + body(hover(server, 9002)))
    assert_still_answers(server)
    assert not any(message.get("id") in (9001, 9002) for message in server.received)


def error_of(server: StdioServer, raw: bytes, msg_id: object) -> dict:
    server.write(frame(raw))
    # `"id": null` written out when the request's id could not be read (JSON-RPC 2.0, 5.1).
    answer = server.wait_for(lambda m: "error" in m and "id" in m and m["id"] == msg_id)
    return answer["error"]


@pytest.mark.parametrize(
    ("raw", "msg_id", "code"),
    [
        (b"{not json", None, PARSE_ERROR),
        (
            b'{"jsonrpc": "2.0", "id": 7001, "method": "textDocument/hover", "params": ' + b"[" * 5000,
            None,
            PARSE_ERROR,
        ),
        (b"[]", None, INVALID_REQUEST),
        (b"5", None, INVALID_REQUEST),
        (b'{"id": 7002, "method": "textDocument/hover", "params": {}}', 7002, INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "textDocument/hover"}', None, INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": 7003, "method": 5}', 7003, INVALID_REQUEST),
        (b'{"jsonrpc": "2.0", "id": 7004, "method": "no/such/method"}', 7004, METHOD_NOT_FOUND),
        (
            b'{"jsonrpc": "2.0", "id": 7005, "method": "textDocument/hover", "params": "x"}',
            7005,
            INVALID_PARAMS,
        ),
    ],
)
def test_malformed_messages_are_answered(server: StdioServer, raw: bytes, msg_id: object, code: int):
    assert error_of(server, raw, msg_id)["code"] == code
    assert_still_answers(server, 2)


def test_each_request_of_a_batch_is_answered(server: StdioServer):
    server.write(frame(json.dumps([hover(server, 7101), hover(server, 7102)]).encode()))
    for msg_id in (7101, 7102):
        assert server.response(msg_id)["error"]["code"] == INVALID_REQUEST


def position_params(server: StdioServer, line: int, character: int) -> dict:
    return {"textDocument": {"uri": server.uri}, "position": {"line": line, "character": character}}


@pytest.mark.parametrize(
    ("method", "params", "where"),
    [
        ("textDocument/hover", "position", "negative line"),
        (
            "textDocument/hover",
            {"textDocument": {"uri": "file:///x.py"}, "position": {"line": "0", "character": 0}},
            "line",
        ),
        ("textDocument/codeAction", "no context", "context"),
        ("textDocument/hover", {"textDocument": {"uri": 5}, "position": {"line": 0, "character": 0}}, "uri"),
        ("textDocument/inlayHint", {"textDocument": {}}, "range"),
        ("codeAction/resolve", {"title": 5}, "title"),
    ],
)
def test_params_that_do_not_fit_the_schema_are_invalid_params(
    server: StdioServer, method: str, params: object, where: str
):
    if params == "position":
        params = position_params(server, -1, 0)
    elif params == "no context":
        params = {
            "textDocument": {"uri": server.uri},
            "range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 1}},
        }
    answer = server.call(method, params)
    assert answer["error"]["code"] == INVALID_PARAMS, answer
    assert_still_answers(server, 2)


def command(server: StdioServer, name: str, arguments: object = "absent") -> dict:
    params: dict = {"command": name}
    if arguments != "absent":
        params["arguments"] = arguments
    return server.call("workspace/executeCommand", params)


def test_a_command_without_arguments_is_invalid_params(server: StdioServer):
    answer = command(server, "oom-lsp.profile")
    assert answer["error"]["code"] == INVALID_PARAMS
    assert "Expected 1 arguments, got 0" in answer["error"]["message"]


def test_a_string_is_not_an_argument_list(server: StdioServer):
    answer = command(server, "oom-lsp.profile", [{"uri": server.uri, "args": "--epochs 1"}])
    assert answer["error"]["code"] == INVALID_PARAMS
    assert "@ $.args" in answer["error"]["message"]


COMMANDS = {
    "oom-lsp.profile": ["steps", "args", "python", "device", "timeout"],
    "oom-lsp.estimate": [
        "batchSize",
        "gpu",
        "gpuMemory",
        "device",
        "args",
        "python",
        "findMaxBatch",
        "timeout",
    ],
    "oom-lsp.explainOom": ["text", "path"],
    "oom-lsp.askAi": ["line", "code"],
    "oom-lsp.validateFix": [],
    "oom-lsp.showReport": [],
    "oom-lsp.openOomReport": ["path"],
    "oom-lsp.logAiFix": ["id"],
}
WRONG = [None, 5, -1, 2.5, "x", "--epochs 1", True, [], [1, "a"], {}, {"a": {"b": []}}]


def test_wrong_typed_command_arguments_never_give_an_internal_error(server: StdioServer, tmp_path: Path):
    """Every field of every command with values of the wrong type or shape (and a file that
    does not exist, so no job starts): each request is answered, none with InternalError."""
    missing = (tmp_path / "missing.py").as_uri()
    answers = []
    for name, fields in COMMANDS.items():
        for value in WRONG:
            answers.append(command(server, name, [value]))
            answers.append(command(server, name, [{"uri": value}]))
            for field in fields:
                answers.append(command(server, name, [{"uri": missing, field: value}]))
    assert len(answers) > 200
    internal = [answer for answer in answers if answer.get("error", {}).get("code") == INTERNAL_ERROR]
    assert internal == []
    assert_still_answers(server, 2)


def test_an_answer_of_the_client_that_does_not_fit_does_not_hang_the_request(
    server: StdioServer, tmp_path: Path
):
    report = tmp_path / "report.json"
    report.write_text("{}")
    server.answers["window/showDocument"] = {"success": "maybe"}
    try:
        answer = command(server, "oom-lsp.openOomReport", [{"path": str(report)}])
    finally:
        del server.answers["window/showDocument"]
    assert "does not fit the schema" in answer["error"]["message"]
    assert_still_answers(server, 2)


def test_requests_after_shutdown_are_invalid_and_exit_without_shutdown_is_1(tmp_path: Path):
    late = StdioServer(tmp_path)
    late.uri = (tmp_path / "train.py").as_uri()
    try:
        late.initialize()
        assert late.call("shutdown")["result"] is None
        assert (
            late.call("textDocument/hover", position_params(late, 0, 0))["error"]["code"] == INVALID_REQUEST
        )
        late.notify("exit")
        assert late.exit_code() == 0
    finally:
        late.close()
    rude = StdioServer(tmp_path)
    try:
        rude.initialize()
        rude.notify("exit")
        assert rude.exit_code() == 1  # the spec: exit without shutdown
    finally:
        rude.close()
