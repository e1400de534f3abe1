"""The LSP base protocol's framing (`Content-Length: N` headers, a blank line, N bytes of
JSON), read the way clients really send it, and resynchronised when they get it wrong.

pygls 2.1.1 reads headers with `^Content-Length: (\\d+)\\r\\n$` only and trusts the length:
a lower-case header, LF-only lines or one wrong length leave it skipping everything that
follows, alive and deaf, so no editor restarts it. `MessageFramer` is the replacement:
pure (bytes in, frames out) so each failure can be tested without a process.

- Header names are case-insensitive and lines may end in `\\n` alone (HTTP's rules, which
  the LSP's headers follow); headers other than Content-Length are ignored.
- A body that is not JSON is checked against its neighbours before it is given up: a
  declared length too long holds one whole message and the start of the next (the
  message is taken, the rest read again as headers); too short, and the message goes on
  past it (taken when the rest has arrived). A length larger than what ever arrives is
  noticed when the input stalls (`stalled()`, called by the reader after `STALL_S`).
- Bytes that are not a header where one is expected are skipped up to the next
  `Content-Length:`.
- A message declared over `max_message_bytes` is not read: its bytes are skipped as
  garbage, which keeps memory bounded whatever a client declares.

Every repair is reported as a `problem`; a body that cannot be read at all becomes a frame
without a value, which the server answers with a JSON-RPC ParseError.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

STALL_S = 2.0  # clients write a message at once: a body unfinished this long never will be
MAX_MESSAGE_BYTES = 256 * 2**20
_MAX_HEADER_LINE = 8192
_HEADER_RE = re.compile(rb"\s*([A-Za-z][A-Za-z0-9-]*)[ \t]*:[ \t]*(.*?)[ \t]*")
_CONTENT_LENGTH_RE = re.compile(rb"content-length[ \t]*:", re.IGNORECASE)
_decoder = json.JSONDecoder()


@dataclass(frozen=True)
class Frame:
    """One message (`value`, parsed JSON), or a body that is not JSON (`value` None and
    `unreadable` set, to answer with a ParseError), or only a `problem` to log."""

    value: Any = None
    unreadable: str | None = None
    problem: str | None = None


class MessageFramer:
    def __init__(self, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.max_message_bytes = max_message_bytes
        self._buffer = bytearray()
        self._length: int | None = None  # reading a body of this many bytes
        self._header_length: int | None = None  # the Content-Length of the headers being read
        self._header_lines = 0
        self._waiting = False  # a body that is not JSON, waiting for the rest of its message

    @property
    def awaiting_more(self) -> bool:
        """Whether a body has started and not been completed: the reader should call
        `stalled()` if nothing comes for a while."""
        return self._length is not None

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        return self._drain()

    def stalled(self) -> list[Frame]:
        """Nothing arrived for a while in the middle of a body: decide with what there is."""
        if self._length is None:
            return []
        declared, available = self._length, len(self._buffer)
        frames = self._decide(final=True)
        if frames and frames[0].value is not None and available < declared:
            frames[0] = Frame(
                frames[0].value,
                problem=f"Content-Length {declared} but the message had {available - len(self._buffer)} bytes",
            )
        return frames + self._drain()

    # --- internals ---------------------------------------------------------------------

    def _drain(self) -> list[Frame]:
        frames: list[Frame] = []
        while True:
            if self._length is not None:
                if len(self._buffer) < self._length:
                    return frames
                decided = self._decide(final=False)
                if not decided:
                    return frames  # waiting for the rest of a message with a short length
                frames.extend(decided)
                continue
            newline = self._buffer.find(b"\n")
            if newline == -1:
                if len(self._buffer) > _MAX_HEADER_LINE:
                    frames.extend(self._skip_junk(len(self._buffer) - 32))
                    continue
                return frames
            frames.extend(self._header_line(newline))

    def _header_line(self, newline: int) -> list[Frame]:
        line = bytes(self._buffer[:newline]).rstrip(b"\r")
        if not line.strip():
            del self._buffer[: newline + 1]
            return self._end_of_headers()
        # Where a header should be, the rest of a message whose length was wrong (its
        # last bytes run into the next header, with no newline between) or garbage.
        starts = [match.start() for match in _CONTENT_LENGTH_RE.finditer(line)]
        if starts and line[: starts[-1]].strip():
            return self._skip_junk(starts[-1])
        header = _HEADER_RE.fullmatch(line)
        if header is None:
            return self._skip_junk(newline + 1)
        del self._buffer[: newline + 1]
        self._header_lines += 1
        if header[1].lower() == b"content-length":
            value = header[2]
            if not value.isdigit():
                self._header_length = None
                return [Frame(problem=f"invalid Content-Length {value.decode('latin-1')!r}")]
            self._header_length = int(value)
        return []

    def _end_of_headers(self) -> list[Frame]:
        length, lines = self._header_length, self._header_lines
        self._header_length, self._header_lines = None, 0
        if length is None:
            return [Frame(problem="headers without a valid Content-Length: message skipped")] if lines else []
        if length > self.max_message_bytes:
            # Not skipped by its length, which may be wrong: its bytes are garbage to resync past.
            return [
                Frame(
                    problem=f"a message of {length:,} bytes is over the limit of "
                    f"{self.max_message_bytes:,}: skipped"
                )
            ]
        self._length = length
        return []

    def _skip_junk(self, count: int) -> list[Frame]:
        del self._buffer[:count]
        return [Frame(problem=f"skipped {count} bytes that were not a message header")]

    def _decide(self, final: bool) -> list[Frame]:
        """Frames for the body at the start of the buffer (the declared length is there,
        unless `final`), consuming it; [] to wait for more input."""
        assert self._length is not None
        declared = self._length
        body = bytes(self._buffer[: min(declared, len(self._buffer))])
        try:
            value = json.loads(body)
        except RecursionError:
            return self._consume(declared, [Frame(unreadable="nested too deeply")])
        except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
            reason = str(error)
        else:
            return self._consume(declared, [Frame(value)])
        # Too long: one whole message, then the start of the next one.
        prefix = _leading_value(body)
        if prefix is not None:
            value, end = prefix
            return self._consume(
                end,
                [
                    Frame(
                        value, problem=f"Content-Length {declared} was longer than the message ({end} bytes)"
                    )
                ],
            )
        # Too short: the message goes on past the declared length.
        whole = _leading_value(bytes(self._buffer))
        if whole is not None and whole[1] > declared:
            value, end = whole
            return self._consume(
                end,
                [
                    Frame(
                        value, problem=f"Content-Length {declared} was shorter than the message ({end} bytes)"
                    )
                ],
            )
        if not final and len(self._buffer) == declared:
            return []  # the rest of the message may still be on its way
        # Cut short, its declared length ran into the next message: read that one again.
        next_header = _CONTENT_LENGTH_RE.search(body)
        return self._consume(next_header.start() if next_header else declared, [Frame(unreadable=reason)])

    def _consume(self, count: int, frames: list[Frame]) -> list[Frame]:
        del self._buffer[: min(count, len(self._buffer))]
        self._length = None
        return frames


def _leading_value(data: bytes) -> tuple[Any, int] | None:
    """The JSON object at the start of `data` and its length in bytes, when there is one."""
    text = data.decode("utf-8", errors="surrogateescape")
    start = len(text) - len(text.lstrip())
    if not text[start:].startswith(("{", "[")):
        return None
    try:
        value, end = _decoder.raw_decode(text, start)
    except (ValueError, RecursionError):
        return None
    return value, len(text[:end].encode("utf-8", errors="surrogateescape"))
