"""A bare LSP client over the server's real stdin/stdout, for what pytest-lsp cannot send:
broken framing, malformed JSON, wrong-typed params, a server killed mid-job. It answers
the server's own requests as an editor would and records every message it receives."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.server.lsp_session import CAPABILITIES_DIR, CLIENTS, SERVER_COMMAND

Message = dict[str, Any]


def frame(message: Message | bytes) -> bytes:
    body = message if isinstance(message, bytes) else json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n" % len(body) + body


class StdioServer:
    def __init__(
        self, root: Path, env: dict[str, str] | None = None, settings: dict[str, Any] | None = None
    ) -> None:
        self.root = root
        self.settings = settings or {}
        self.stderr_path = root / "server.stderr"
        self._stderr = open(self.stderr_path, "wb")
        self.process = subprocess.Popen(
            SERVER_COMMAND,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env={**os.environ, **(env or {})},
        )
        self.received: list[Message] = []
        self.answers: dict[str, Any] = {}  # method -> the result to answer the server's request with
        self._inbox: queue.Queue[Message | None] = queue.Queue()
        self._ids = iter(range(1, 10**9))
        threading.Thread(target=self._read, daemon=True).start()

    # --- wire ---------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def send(self, message: Message) -> None:
        self.write(frame(message))

    def _read(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        while True:
            length = None
            while True:
                line = stream.readline()
                if not line:
                    self._inbox.put(None)
                    return
                if line in (b"\r\n", b"\n"):
                    break
                name, _, value = line.decode("ascii").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            assert length is not None, "the server sent a message without Content-Length"
            self._inbox.put(json.loads(stream.read(length)))

    # --- conversation -------------------------------------------------------------

    def next_id(self) -> int:
        return next(self._ids)

    def request(self, method: str, params: Any = None, msg_id: Any = None) -> Any:
        msg_id = self.next_id() if msg_id is None else msg_id
        message: Message = {"jsonrpc": "2.0", "id": msg_id, "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)
        return msg_id

    def notify(self, method: str, params: Any = None) -> None:
        message: Message = {"jsonrpc": "2.0", "method": method}
        if params is not None:
            message["params"] = params
        self.send(message)

    def wait_for(self, predicate: Callable[[Message], bool], timeout: float = 30.0) -> Message:
        """The first message received from now on that matches; the server's requests
        met on the way are answered."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"timed out; last messages: {self.received[-5:]}"
            try:
                message = self._inbox.get(timeout=remaining)
            except queue.Empty:
                continue
            assert message is not None, (
                f"the server closed its output: {self.stderr_path.read_text()[-2000:]}"
            )
            self.received.append(message)
            if "method" in message and "id" in message:
                self._answer(message)
            if predicate(message):
                return message

    def response(self, msg_id: Any, timeout: float = 30.0) -> Message:
        return self.wait_for(lambda message: message.get("id") == msg_id and "method" not in message, timeout)

    def call(self, method: str, params: Any = None, timeout: float = 30.0) -> Message:
        return self.response(self.request(method, params), timeout)

    def _answer(self, request: Message) -> None:
        method = request["method"]
        if method in self.answers:
            result = self.answers[method]
        elif method == "workspace/configuration":
            result: Any = [self.settings for _ in request["params"]["items"]]
        elif method == "workspace/applyEdit":
            result = {"applied": True}
        elif method == "window/showDocument":
            result = {"success": True}
        else:  # window/workDoneProgress/create, client/registerCapability, refreshes
            result = None
        self.send({"jsonrpc": "2.0", "id": request["id"], "result": result})

    def initialize(self, client: str = "vscode-1.139.1", initialization_options: Any = None) -> Message:
        params = json.loads((CAPABILITIES_DIR / f"{CLIENTS[client]}.initialize.json").read_text())
        params.update(
            processId=os.getpid(),
            rootUri=self.root.as_uri(),
            rootPath=str(self.root),
            workspaceFolders=[{"uri": self.root.as_uri(), "name": self.root.name}],
            initializationOptions=initialization_options
            if initialization_options is not None
            else {"settings": self.settings},
        )
        answer = self.call("initialize", params)
        self.notify("initialized", {})
        return answer

    def open(self, path: Path, text: str, version: int = 1) -> str:
        uri = path.as_uri()
        self.notify(
            "textDocument/didOpen",
            {"textDocument": {"uri": uri, "languageId": "python", "version": version, "text": text}},
        )
        return uri

    def diagnostics(self, uri: str, timeout: float = 30.0) -> list[Message]:
        """The document's diagnostics: pulled when the client can pull, else the next push."""
        if self.pulls:
            answer = self.call("textDocument/diagnostic", {"textDocument": {"uri": uri}}, timeout)
            return answer["result"]["items"]
        pushed = self.wait_for(
            lambda m: m.get("method") == "textDocument/publishDiagnostics" and m["params"]["uri"] == uri,
            timeout,
        )
        return pushed["params"]["diagnostics"]

    @property
    def pulls(self) -> bool:
        answer = next((m for m in self.received if m.get("id") == 1 and "result" in m), None)
        return bool(answer and answer["result"]["capabilities"].get("diagnosticProvider"))

    # --- the end ------------------------------------------------------------------

    def exit_code(self, timeout: float = 30.0) -> int:
        return self.process.wait(timeout=timeout)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                try:
                    stream.close()
                except BrokenPipeError:
                    pass  # the server is gone
        self._stderr.close()


def alive(pid: int) -> bool:
    """Whether `pid` is a running process (a zombie is not: only its exit status is left)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def descendants(pid: int) -> set[int]:
    """The processes below `pid`, from /proc (whatever session they started)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry.name))
    found: set[int] = set()
    pending = [pid]
    while pending:
        for child in children.get(pending.pop(), []):
            if child not in found:
                found.add(child)
                pending.append(child)
    return found


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout:g} s waiting until {what}"
        time.sleep(0.1)
