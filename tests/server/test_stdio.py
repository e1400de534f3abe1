"""The server process itself: silent stderr over a whole session, and --tcp."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO

from tests.samples import LLAMA_ON_GPU
from tests.server.lsp_session import SERVER_COMMAND

# A checkpoint of a CUDA model restored without map_location (OOM501).
LOAD = 'import torch\n\nstate = torch.load("ckpt.pt")\n' + LLAMA_ON_GPU + 'net.load_state_dict(state["net"])\n'


def _frame(message: dict) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


def _read_message(stream: IO[bytes]) -> dict:
    length = 0
    while True:
        header = stream.readline()
        assert header, "the server closed its output"
        if header in (b"\r\n", b"\n"):
            break
        name, _, value = header.decode().partition(":")
        if name.lower() == "content-length":
            length = int(value)
    return json.loads(stream.read(length))


def _read_until(stream: IO[bytes], predicate) -> list[dict]:
    seen = []
    while True:
        message = _read_message(stream)
        seen.append(message)
        if predicate(message):
            return seen


def _session(tmp_path: Path) -> tuple[list[dict], list[dict], list[dict]]:
    uri = (tmp_path / "train.py").as_uri()
    opening = [
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {"capabilities": {}, "rootUri": tmp_path.as_uri()},
        },
        {"jsonrpc": "2.0", "method": "initialized", "params": {}},
        {
            "jsonrpc": "2.0",
            "method": "textDocument/didOpen",
            "params": {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": LOAD}},
        },
        {"jsonrpc": "2.0", "method": "$/cancelRequest", "params": {"id": 99}},
    ]
    hover = [
        {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "textDocument/hover",
            "params": {"textDocument": {"uri": uri}, "position": {"line": 2, "character": 12}},
        }
    ]
    closing = [{"jsonrpc": "2.0", "id": 3, "method": "shutdown"}, {"jsonrpc": "2.0", "method": "exit"}]
    return opening, hover, closing


def test_a_whole_session_writes_nothing_on_stderr(tmp_path: Path):
    """Editors show server stderr as errors (pygls logs every message at INFO)."""
    opening, hover, closing = _session(tmp_path)
    server = subprocess.Popen(
        SERVER_COMMAND, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        server.stdin.write(b"".join(map(_frame, opening)))
        server.stdin.flush()
        received = _read_until(server.stdout, lambda m: m.get("method") == "textDocument/publishDiagnostics")
        assert received[-1]["params"]["diagnostics"][0]["code"] == "OOM501"
        server.stdin.write(b"".join(map(_frame, hover)))
        server.stdin.flush()
        answer = _read_until(server.stdout, lambda m: m.get("id") == 2)[-1]
        assert "OOM501" in answer["result"]["contents"]["value"]
        server.stdin.write(b"".join(map(_frame, closing)))
        server.stdin.close()
        assert server.wait(timeout=30) == 0
        assert server.stderr.read() == b""
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_tcp(tmp_path: Path):
    port = _free_port()
    command = [sys.executable, "-m", "oom_lsp", "server", "--tcp", f"127.0.0.1:{port}"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                connection = socket.create_connection(("127.0.0.1", port), timeout=30)
                break
            except ConnectionRefusedError:
                assert time.monotonic() < deadline, "the server never listened"
                assert server.poll() is None, server.stderr.read()
                time.sleep(0.1)
        with connection, connection.makefile("rb") as stream:
            opening, _, closing = _session(tmp_path)
            connection.sendall(b"".join(map(_frame, opening)))
            initialized = _read_until(stream, lambda m: m.get("id") == 1)[-1]
            assert initialized["result"]["serverInfo"]["name"] == "oom-lsp"
            received = _read_until(stream, lambda m: m.get("method") == "textDocument/publishDiagnostics")
            assert received[-1]["params"]["diagnostics"][0]["code"] == "OOM501"
            connection.sendall(_frame(closing[0]))
            assert _read_until(stream, lambda m: m.get("id") == 3)[-1]["result"] is None
    finally:
        server.kill()
        server.wait()
