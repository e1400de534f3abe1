"""The read loops over stdio and TCP, in place of pygls' (see framing.py and protocol.py).

stdin is read by a daemon thread (pygls reads it on its worker pool, whose shutdown then
waits for a read that never returns), handed to the event loop with backpressure, cut
into messages by `MessageFramer`, and each message goes to `OomProtocol.receive`. The
loop ends at `exit`, or when the client closes its end; what still runs then is cancelled
(jobs kill their process groups when cancelled) with `EXIT_GRACE_S` to finish, and the
loop is closed without waiting for worker threads: the caller exits the process.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO

from pygls.io_ import StdoutWriter

from oom_lsp.server.framing import STALL_S, Frame, MessageFramer

logger = logging.getLogger(__name__)

CHUNK_BYTES = 65536
QUEUED_CHUNKS = 64  # read ahead at most 4 MiB
EXIT_GRACE_S = 2.0


async def serve(server: Any, next_chunk: Callable[[], Awaitable[bytes]]) -> None:
    """Read and dispatch messages until `exit` or the end of the input."""
    framer = MessageFramer()
    protocol = server.protocol
    while protocol.exit_code is None:
        try:
            data = await asyncio.wait_for(next_chunk(), STALL_S if framer.awaiting_more else None)
        except asyncio.TimeoutError:
            frames = framer.stalled()
        else:
            if not data:
                logger.info("The client closed the connection")
                return
            frames = framer.feed(data)
        for frame in frames:
            _dispatch(protocol, frame)
            if protocol.exit_code is not None:
                return


def _dispatch(protocol: Any, frame: Frame) -> None:
    if frame.problem:
        logger.warning("Reading the client's messages: %s", frame.problem)
    try:
        if frame.unreadable is not None:
            protocol.receive_unreadable(frame.unreadable)
        elif frame.value is not None:
            protocol.receive(frame.value)
    except Exception:
        logger.exception("Handling a message failed")


def _run(server: Any, main: Callable[[], Awaitable[None]]) -> int:
    """Run `main` on a fresh loop; the exit code: 0 after shutdown and exit, 130 after
    Ctrl-C, else 1."""
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    interrupted = False
    serving = loop.create_task(main())

    def interrupt() -> None:
        nonlocal interrupted
        interrupted = True
        serving.cancel()

    try:
        # Ctrl-C on the server started by hand in a terminal. Through the loop, not as a
        # KeyboardInterrupt: the kernel may hand SIGINT to the stdin thread, and then only
        # the loop's wake-up pipe gets the main thread out of its wait.
        loop.add_signal_handler(signal.SIGINT, interrupt)
    except (NotImplementedError, RuntimeError, ValueError):
        pass  # not the main thread (tests), or a platform without it
    try:
        try:
            loop.run_until_complete(serving)
        except asyncio.CancelledError:
            if not interrupted:
                raise
        pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            loop.run_until_complete(asyncio.wait(pending, timeout=EXIT_GRACE_S))
    except BrokenPipeError:
        logger.error("The connection to the client is lost")
    except KeyboardInterrupt:  # SIGINT where the loop's handler is not installed
        interrupted = True
    finally:
        server.stop_jobs()
        loop.close()  # the default executor is shut down without waiting for its threads
    protocol = server.protocol
    if protocol.exit_code is not None:
        return protocol.exit_code
    if interrupted:
        return 128 + signal.SIGINT
    return 0 if protocol._shutdown else 1


def serve_stdio(server: Any, stdin: BinaryIO | None = None, stdout: BinaryIO | None = None) -> int:
    stdin = stdin or sys.stdin.buffer
    server.protocol.set_writer(StdoutWriter(stdout or sys.stdout.buffer))
    read = getattr(stdin, "read1", None) or stdin.read

    async def main() -> None:
        loop = asyncio.get_running_loop()
        chunks: asyncio.Queue[bytes] = asyncio.Queue(QUEUED_CHUNKS)

        def pump() -> None:
            while True:
                try:
                    data = read(CHUNK_BYTES)
                except (OSError, ValueError):  # closed under us
                    data = b""
                put = chunks.put(data)
                try:
                    asyncio.run_coroutine_threadsafe(put, loop).result()
                except (RuntimeError, concurrent.futures.CancelledError):  # the server is exiting
                    put.close()  # never scheduled: no "never awaited" warning on stderr
                    return
                if not data:
                    return

        threading.Thread(target=pump, name="oom-lsp-stdin", daemon=True).start()
        await serve(server, chunks.get)

    return _run(server, main)


def serve_tcp(server: Any, host: str, port: int) -> int:
    """One client on `host:port`; the server ends with its connection."""

    async def main() -> None:
        finished = asyncio.Event()

        async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            server.protocol.set_writer(writer)
            try:
                await serve(server, lambda: reader.read(CHUNK_BYTES))
            finally:
                finished.set()

        listener = await asyncio.start_server(connection, host, port)
        logger.info("Serving on %s", ", ".join(str(sock.getsockname()) for sock in listener.sockets))
        async with listener:
            await finished.wait()

    return _run(server, main)
