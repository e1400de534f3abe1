"""The CLI's status line on stderr while a long command runs (a profile, an estimate)."""

from __future__ import annotations

import abc
import os
import threading
import time
from typing import Any, TextIO


class LiveLine(abc.ABC):
    """A status line on stderr, redrawn twice a second on a terminal (`render()`); on anything
    else no line at all, only what `line()` prints."""

    def __init__(self, stream: TextIO, label: str, live: bool = True) -> None:
        self.stream = stream
        self.label = label
        self.tty = live and stream.isatty()
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._gone = False  # the stream failed: nothing more is written to it
        self._ticker = threading.Thread(target=self._tick, daemon=True) if self.tty else None

    def __enter__(self) -> LiveLine:
        if self._ticker:
            self._ticker.start()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._stop.set()
        if self._ticker:
            self._ticker.join()
            with self._lock:
                self._write("\n")

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @abc.abstractmethod
    def render(self) -> str:
        """The status line's text."""

    def _tick(self) -> None:
        while not self._stop.wait(0.5):
            self.draw()

    def draw(self) -> None:
        try:
            columns = os.get_terminal_size(self.stream.fileno()).columns
        except (OSError, ValueError):  # not a real file descriptor
            columns = 0
        width = (columns or 80) - 1  # a terminal that reports no size (a bare pty) gets 80
        with self._lock:
            self._write(f"\r{self.render()[:width]}\x1b[K")

    def line(self, text: str) -> None:
        """A line of its own, above the status line on a terminal."""
        with self._lock:
            self._write(("\r\x1b[K" if self.tty else "") + text + "\n")
        if self.tty:
            self.draw()

    def _write(self, text: str) -> None:
        """Write and flush, unless the stream is gone: a terminal that hung up (its window
        closed, the SSH connection dropped) fails every write with EIO, and the SIGHUP that
        comes with it must end the command as an interrupt, not as that error."""
        if self._gone:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):
            self._gone = True
            self._stop.set()
