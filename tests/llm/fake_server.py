"""A loopback OpenAI-compatible server for the tests: 127.0.0.1 only, an ephemeral port,
served from a thread. `POST /v1/chat/completions` answers from a queue of scripted turns,
as JSON or, when the request says `stream: true`, as server-sent events; every request
body and header is recorded.

A turn: {"content": "..."} (optionally "finish_reason"), {"status": 429, "headers": {...},
"error": "..."}, {"delay": seconds, ...} (answer late, for timeouts and cancellation),
{"raw": "..."} (an HTTP 200 with exactly that body, as JSON or as an event stream: a
broken or hostile server).
When the queue is empty the server answers 500 "no scripted turn left", so a test that
sends more requests than it scripted fails loudly.
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class FakeModelServer:
    def __init__(self) -> None:
        self.turns: deque[dict[str, Any]] = deque()
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                with owner._lock:
                    owner.requests.append(
                        {
                            "path": self.path,
                            "body": body,
                            "headers": {name.lower(): value for name, value in self.headers.items()},
                        }
                    )
                    turn = (
                        owner.turns.popleft()
                        if owner.turns
                        else {"status": 500, "error": "no scripted turn left"}
                    )
                if self.path != "/v1/chat/completions":
                    turn = {"status": 404, "error": f"no route {self.path}"}
                if turn.get("delay") and owner._stop.wait(turn["delay"]):
                    return  # the test is over
                if "raw" in turn:
                    self._send_raw(turn["raw"], "text/event-stream" if body.get("stream") else "application/json")
                elif "status" in turn:
                    self._send(
                        turn["status"],
                        {"error": {"message": turn.get("error", "error"), "type": "test"}},
                        turn.get("headers", {}),
                    )
                elif body.get("stream"):
                    self._stream(body, turn)
                else:
                    self._send(200, _completion(body, turn))

            def _send(
                self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None
            ) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _send_raw(self, raw: str, content_type: str) -> None:
                data = raw.encode()
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, body: dict[str, Any], turn: dict[str, Any]) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                content = turn["content"]
                pieces = [content[i : i + 40] for i in range(0, len(content), 40)]
                for index, piece in enumerate(pieces):
                    last = index == len(pieces) - 1
                    chunk = {
                        "id": "chatcmpl-test",
                        "object": "chat.completion.chunk",
                        "created": 0,
                        "model": body.get("model", "test"),
                        "choices": [
                            {
                                "index": 0,
                                "delta": {"role": "assistant", "content": piece},
                                "finish_reason": turn.get("finish_reason", "stop") if last else None,
                            }
                        ],
                    }
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that gave up (timeout, cancellation) closes the socket under us

        self._server = Server(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def script(self, *turns: dict[str, Any]) -> None:
        self.turns.extend(turns)

    def __enter__(self) -> FakeModelServer:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def _completion(body: dict[str, Any], turn: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "test"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": turn["content"]},
                "finish_reason": turn.get("finish_reason", "stop"),
            }
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 50, "total_tokens": 150},
    }
