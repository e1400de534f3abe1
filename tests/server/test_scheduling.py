"""server/scheduling.py on its own: one pending analysis per document, and pygls' futures of
notification handlers not kept (the end-to-end behaviour is tests/server/test_load.py's)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading

import pytest

from oom_lsp.server.scheduling import AnalysisQueue, Superseded


async def test_a_newer_text_replaces_the_waiting_analysis_and_the_same_text_shares_it() -> None:
    queue = AnalysisQueue()
    executor = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    release = threading.Event()
    ran: list[str] = []

    def analysis(text: str) -> str:
        if text == "running":
            release.wait(10)
        ran.append(text)
        return text.upper()

    try:
        running = queue.submit("a.py", "running", executor, lambda: analysis("running"))
        await asyncio.sleep(0.05)  # started: it cannot be replaced any more
        waiting = queue.submit("b.py", "v1", executor, lambda: analysis("v1"))
        replaced = queue.submit("b.py", "v2", executor, lambda: analysis("v2"))
        shared = queue.submit("b.py", "v2", executor, lambda: analysis("v2 again"))
        newest = queue.submit("b.py", "v3", executor, lambda: analysis("v3"))
        assert shared is replaced
        release.set()
        assert await running == "RUNNING"
        assert await newest == "V3"
        for superseded in (waiting, replaced):
            with pytest.raises(Superseded):
                await superseded
        assert ran == ["running", "v3"]
        assert (queue.computed, queue.superseded, queue.pending()) == (2, 2, 0)
    finally:
        release.set()
        executor.shutdown(wait=True)


async def test_notification_handlers_leave_no_future_behind() -> None:
    from oom_lsp.server.features import create_server

    server = create_server()

    class Sink:
        def write(self, data: bytes) -> None:
            pass

        def flush(self) -> None:
            pass

    from pygls.io_ import StdoutWriter

    server.protocol.set_writer(StdoutWriter(Sink()))
    uri = "untitled:load.py"
    server.protocol.receive(
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"processId": None, "capabilities": {}}}
    )
    server.protocol.receive(
        {
            "jsonrpc": "2.0",
            "method": "textDocument/didOpen",
            "params": {"textDocument": {"uri": uri, "languageId": "python", "version": 1, "text": "x = 1\n"}},
        }
    )
    for version in range(2, 202):
        server.protocol.receive(
            {
                "jsonrpc": "2.0",
                "method": "textDocument/didChange",
                "params": {
                    "textDocument": {"uri": uri, "version": version},
                    "contentChanges": [{"text": f"x = {version}\n"}],
                },
            }
        )
    await asyncio.sleep(0.1)
    # pygls kept one future per notification (~0.5 KB each, forever).
    assert len(server.protocol._request_futures) == 0
    server.analysis_executor.shutdown(wait=False, cancel_futures=True)
