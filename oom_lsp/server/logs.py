"""Logging: nothing on stderr (editors show server stderr as errors), user
facing records through `window/logMessage`, everything optionally to a file.

pygls logs every message it sends at INFO; its loggers stay at WARNING unless
`logLevel` is `debug`, and even then only the log file gets its chatter:
forwarding it as `window/logMessage` would log the sending of the log.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import TYPE_CHECKING

from lsprotocol import types

if TYPE_CHECKING:
    from oom_lsp.server.server import OomLanguageServer

_MESSAGE_TYPES = [
    (logging.ERROR, types.MessageType.Error),
    (logging.WARNING, types.MessageType.Warning),
    (logging.INFO, types.MessageType.Info),
]
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class ClientLogHandler(logging.Handler):
    """Sends records to the client as `window/logMessage`."""

    def __init__(self, server: OomLanguageServer) -> None:
        super().__init__()
        self.server = server
        self.loop: asyncio.AbstractEventLoop | None = None
        self.loop_thread: int | None = None
        # Set while a record is being sent: one raised meanwhile is not sent (it would loop).
        self._sending = threading.local()
        self.setFormatter(logging.Formatter("%(message)s"))

    def attach(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.loop_thread = threading.get_ident()

    def filter(self, record: logging.LogRecord) -> bool:
        own = record.name == "oom_lsp" or record.name.startswith("oom_lsp.")
        return own or record.levelno >= logging.WARNING

    def emit(self, record: logging.LogRecord) -> None:
        if self.loop is None or getattr(self._sending, "active", False):
            return  # not connected yet, or a record raised while sending one
        message_type = next(
            (kind for level, kind in _MESSAGE_TYPES if record.levelno >= level), types.MessageType.Log
        )
        params = types.LogMessageParams(type=message_type, message=self.format(record))
        if threading.get_ident() == self.loop_thread:
            self._send(params)
        elif not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self._send, params)

    def _send(self, params: types.LogMessageParams) -> None:
        self._sending.active = True
        try:
            self.server.window_log_message(params)
        finally:
            self._sending.active = False


class LogSetup:
    def __init__(self, server: OomLanguageServer, cli_log_file: str | None) -> None:
        self.client_handler = ClientLogHandler(server)
        self.cli_log_file = cli_log_file
        self.file_handler: logging.FileHandler | None = None
        self.file_path: str | None = None
        root = logging.getLogger()
        # Replaces the last-resort handler, which would write warnings to stderr.
        root.addHandler(self.client_handler)
        root.setLevel(logging.DEBUG)
        self.configure(logging.INFO, None)

    def configure(self, level: int, settings_log_file: str | None) -> None:
        """Apply `logLevel` and `logFile` (the command line's `--log-file` wins)."""
        self.client_handler.setLevel(level)
        logging.getLogger("oom_lsp").setLevel(level)
        logging.getLogger("pygls").setLevel(logging.DEBUG if level <= logging.DEBUG else logging.WARNING)
        path = self.cli_log_file or settings_log_file
        if path != self.file_path:
            self._open_file(path)
        if self.file_handler is not None:
            self.file_handler.setLevel(level)

    def _open_file(self, path: str | None) -> None:
        root = logging.getLogger()
        if self.file_handler is not None:
            root.removeHandler(self.file_handler)
            self.file_handler.close()
            self.file_handler = None
        self.file_path = path
        if path is None:
            return
        try:
            handler = logging.FileHandler(path, encoding="utf-8")
        except OSError as error:
            logging.getLogger(__name__).error("Cannot open the log file %s: %s", path, error)
            return
        handler.setFormatter(logging.Formatter(_FORMAT))
        root.addHandler(handler)
        self.file_handler = handler
