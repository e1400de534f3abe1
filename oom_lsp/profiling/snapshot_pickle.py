"""Read a CUDA memory snapshot pickle as a stream: its segments and its trace events are handed
to the caller one at a time and never held together, so a 2 GB snapshot is read in bounded
memory (Python's unpickler builds the whole object graph: 3 to 14 bytes of RSS per byte of pickle,
by how often its frames repeat).

The reader is a small pickle machine for plain data (protocols 2-5: dicts, lists, tuples, sets,
strings, bytes, numbers, None, booleans); any opcode that would import or call something is
refused, so a hostile pickle runs nothing. Two facts about the files `torch.cuda.memory.
_dump_snapshot` writes make it fast and small:

* Trace entries are never shared: each is pickled in place, so once handed over nothing can
  refer to it again. Its memo slot is left empty (a later reference to it is an error, said so).
* PyTorch symbolizes each distinct frame once and each traceback is a list of references to
  those frames (`py_symbolize`), so a trace entry is a flat run of memo references and small
  ints. Each entry layout (its key order) gets one compiled pattern that reads a whole entry
  in one match; a traceback becomes a tuple shared by every entry with the same bytes. What the
  pattern does not cover (first occurrences of strings and frames, an entry split by a pickle
  frame boundary) goes through the general machine, which gives the same values.
"""

from __future__ import annotations

import gzip
import re
import struct
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

CHUNK = 8 * 2**20
MAX_ITEM = 256 * 2**20  # no string in a snapshot comes near; a larger length is corruption


class SnapshotReadError(ValueError):
    """Not a snapshot pickle this reader accepts; the message says why in one line."""


class _Mark:
    __slots__ = ()


MARK = _Mark()


class _Dropped:
    """The memo slot of a trace entry already handed over."""

    __slots__ = ()


DROPPED = _Dropped()


class _SinkList(list):
    """The 'segments' list or one device's trace list: items appended to it go to the caller."""

    __slots__ = ("device",)

    def __init__(self, device: int | None) -> None:
        super().__init__()
        self.device = device  # None: the segments


OnSegment = Callable[[dict[str, Any]], None]
OnEntry = Callable[[Any, Any, Any, Any, Any], None]  # the FIELDS of one trace entry
OnTrace = Callable[[int], OnEntry]  # a device's trace list starts: where its entries go

_FIXED_ARGUMENT = {  # opcode -> the bytes of its argument, for the opcodes that have a fixed one
    ord("K"): 1, ord("M"): 2, ord("J"): 4, ord("h"): 1, ord("j"): 4, ord("q"): 1, ord("r"): 4,
    ord("G"): 8, 0x80: 1, 0x95: 8,
}
_REFUSED = {
    ord("c"): "GLOBAL", 0x93: "STACK_GLOBAL", ord("R"): "REDUCE", ord("b"): "BUILD", ord("i"): "INST",
    ord("o"): "OBJ", 0x81: "NEWOBJ", 0x92: "NEWOBJ_EX", ord("P"): "PERSID", ord("Q"): "BINPERSID",
    0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4", 0x97: "NEXT_BUFFER", 0x98: "READONLY_BUFFER",
}

_REF = rb"(?:h.|j....)"
# A new list of references: a traceback. Big snapshots have over 256 memo slots, so its
# references are mostly LONG_BINGET; possessive, as there is nothing to backtrack into.
_LIST = rb"\]\x94(?:\((?:j....|h.)*+e|(?:j....|h.)a)?"
_LONG1 = [rb"\x8a\x00"] + [rb"\x8a" + bytes([n]) + rb".{%d}" % n for n in range(1, 9)]
_INTS = [rb"K.", rb"M..", rb"J...."] + _LONG1
_OTHERS = rb"N|\x88|\x89|G.{8}"


def _int_opcode(value: int) -> int:
    """Which of _INTS CPython's pickler writes for value."""
    if 0 <= value < 256:
        return 0
    if 0 <= value < 65536:
        return 1
    if -(2**31) <= value < 2**31:
        return 2
    return 3 + min(8, (value.bit_length() >> 3) + 1)


def _likeliest_first(value: Any, frames: bool) -> bytes:
    """A value of a trace entry the pattern reads: a number, None/True/False, a memo reference
    (and for the frames, a new list of references). The regex engine tries alternatives in order:
    the kind the first entry of the layout had comes first."""
    if frames:
        kinds = [_LIST, _REF, *_INTS, _OTHERS]
    elif isinstance(value, int) and not isinstance(value, bool):
        likeliest = _INTS[_int_opcode(value)]
        kinds = [likeliest, *(kind for kind in _INTS if kind != likeliest), _REF, _OTHERS]
    else:
        kinds = [_REF, *_INTS, _OTHERS]
    return b"(?:" + b"|".join(kinds) + b")"


def _ref_bytes(index: int) -> bytes:
    return b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)


# What the caller is handed of each trace entry, in this order.
FIELDS = ("action", "addr", "size", "frames", "category")


class _Layout:
    """One trace-entry layout: its keys in order, and the pattern that reads an entry of it whole
    (an empty dict, memoized, then its keys as memo references with their values, then SETITEMS).
    Only the FIELDS are captured; a new list is read only as the frames (memoized, in its place),
    so an entry with a list elsewhere does not match and goes through the general machine."""

    def __init__(self, entry: dict[str, Any], key_refs: list[bytes]) -> None:
        self.keys = tuple(entry)
        body = []
        groups: dict[str, int] = {}
        for key, ref in zip(self.keys, key_refs):
            value = _likeliest_first(entry[key], frames=key == "frames")
            if key in FIELDS:
                groups[key] = len(groups) + 1
                body.append(re.escape(ref) + b"(" + value + b")")
            else:
                body.append(re.escape(ref) + value)
        absent = len(groups) + 1  # an empty group at the end stands for every field the layout lacks
        self.groups = tuple(groups.get(field, absent) for field in FIELDS)
        self.pattern = re.compile(rb"\}\x94\(" + b"".join(body) + rb"u()", re.DOTALL)


class SnapshotStream:
    """One pass over a snapshot pickle; `run()` calls on_segment for each segment (a plain dict)
    and, for each trace entry, the handler on_trace(device) gave for its device, with the entry's
    FIELDS (None where it has none), in the file's order. Frames come as tuples of frame dicts:
    one tuple object per distinct traceback, alive as long as the stream."""

    def __init__(self, handle: IO[bytes], on_segment: OnSegment, on_trace: OnTrace, source: str = "") -> None:
        self.handle = handle
        self.on_segment = on_segment
        self.on_trace = on_trace
        self.entry_handlers: dict[int, OnEntry] = {}
        self.source = source
        self.buffer = b""
        self.pos = 0
        self.eof = False
        self.memo: list[Any] = []
        self.stack: list[Any] = []
        self.marks: list[int] = []
        self.layouts: list[_Layout] = []
        self.layout_keys: set[tuple[str, ...]] = set()
        self.tracebacks: dict[bytes, tuple[dict[str, Any], ...]] = {}  # a traceback's bytes -> its frames
        self.values: dict[bytes, Any] = {}  # a scalar's or reference's bytes -> its value
        self.traceback_ids: dict[bytes, tuple[dict[str, Any], ...]] = {}
        self.events = 0

    # -- input -----------------------------------------------------------------------------
    def _fill(self, need: int) -> None:
        """At least `need` bytes after pos in the buffer, or all that is left."""
        if self.pos:
            self.buffer = self.buffer[self.pos:]
            self.pos = 0
        pieces = [self.buffer]
        have = len(self.buffer)
        while have < need and not self.eof:
            chunk = self.handle.read(CHUNK)  # a length a corrupt pickle names is never read at once
            if not chunk:
                self.eof = True
                break
            pieces.append(chunk)
            have += len(chunk)
        self.buffer = b"".join(pieces)

    def _take(self, count: int) -> bytes:
        if self.pos + count > len(self.buffer):
            if count > MAX_ITEM:
                raise SnapshotReadError(f"{self.source}: a corrupt pickle (an item of {count:,} bytes)")
            self._fill(count)
            if count > len(self.buffer):
                raise SnapshotReadError(f"{self.source}: the pickle is truncated")
        start = self.pos
        self.pos = start + count
        return self.buffer[start:self.pos]

    def _line(self) -> bytes:
        while True:
            end = self.buffer.find(b"\n", self.pos)
            if end >= 0:
                line = self.buffer[self.pos:end]
                self.pos = end + 1
                return line
            if self.eof:
                raise SnapshotReadError(f"{self.source}: the pickle is truncated")
            self._fill(len(self.buffer) - self.pos + CHUNK)

    # -- the machine -----------------------------------------------------------------------
    def run(self) -> None:
        stack, memo = self.stack, self.memo
        while True:
            if self.pos >= len(self.buffer):
                self._fill(1)
                if not self.buffer:
                    raise SnapshotReadError(f"{self.source}: the pickle is truncated")
            # Inside a device's trace list, between entries: read entries whole while they fit a layout.
            if len(stack) >= 2 and stack[-1] is MARK and type(stack[-2]) is _SinkList and stack[-2].device is not None:
                self._fast_entries(stack[-2].device)
                if self.pos >= len(self.buffer):
                    continue
            opcode = self.buffer[self.pos]
            self.pos += 1
            if opcode == 0x94:  # MEMOIZE
                memo.append(stack[-1])
            elif opcode == 0x68 or opcode == 0x6A:  # BINGET, LONG_BINGET
                raw = self._take(1 if opcode == 0x68 else 4)
                stack.append(self._memo_get(int.from_bytes(raw, "little")))
            elif opcode == 0x28:  # MARK
                self.marks.append(len(stack))
                stack.append(MARK)
            elif opcode == 0x8C:  # SHORT_BINUNICODE
                stack.append(self._text(self._take(self._take(1)[0])))
            elif opcode == 0x58:  # BINUNICODE
                stack.append(self._text(self._take(struct.unpack("<I", self._take(4))[0])))
            elif opcode == 0x8D:  # BINUNICODE8
                stack.append(self._text(self._take(struct.unpack("<Q", self._take(8))[0])))
            elif opcode == 0x4B:  # BININT1
                stack.append(self._take(1)[0])
            elif opcode == 0x4D:  # BININT2
                stack.append(int.from_bytes(self._take(2), "little"))
            elif opcode == 0x4A:  # BININT
                stack.append(int.from_bytes(self._take(4), "little", signed=True))
            elif opcode == 0x8A:  # LONG1
                stack.append(int.from_bytes(self._take(self._take(1)[0]), "little", signed=True))
            elif opcode == 0x8B:  # LONG4
                stack.append(int.from_bytes(self._take(struct.unpack("<i", self._take(4))[0]), "little", signed=True))
            elif opcode == 0x47:  # BINFLOAT
                stack.append(struct.unpack(">d", self._take(8))[0])
            elif opcode == 0x4E:  # NONE
                stack.append(None)
            elif opcode == 0x88:
                stack.append(True)
            elif opcode == 0x89:
                stack.append(False)
            elif opcode == 0x7D:  # EMPTY_DICT
                stack.append({})
            elif opcode == 0x5D:  # EMPTY_LIST
                stack.append(self._new_list())
            elif opcode == 0x29:  # EMPTY_TUPLE
                stack.append(())
            elif opcode == 0x75:  # SETITEMS
                items = self._pop_mark()
                target = stack[-1]
                for i in range(0, len(items) - 1, 2):
                    target[items[i]] = items[i + 1]
                self._entry_done()
            elif opcode == 0x73:  # SETITEM
                value = stack.pop()
                key = stack.pop()
                stack[-1][key] = value
                self._entry_done()
            elif opcode == 0x65:  # APPENDS
                items = self._pop_mark()
                self._extend(stack[-1], items)
            elif opcode == 0x61:  # APPEND
                item = stack.pop()
                self._extend(stack[-1], [item])
            elif opcode == 0x95:  # FRAME: only a length hint
                self._take(8)
            elif opcode == 0x80:  # PROTO
                protocol = self._take(1)[0]
                if protocol < 2:
                    raise SnapshotReadError(f"{self.source}: a protocol {protocol} pickle; snapshots are protocol 2 or later")
            elif opcode == 0x2E:  # STOP
                return
            elif opcode == 0x71 or opcode == 0x72:  # BINPUT, LONG_BINPUT
                self._memo_put(int.from_bytes(self._take(1 if opcode == 0x71 else 4), "little"), stack[-1])
            elif opcode == 0x74:  # TUPLE
                stack.append(tuple(self._pop_mark()))
            elif opcode in (0x85, 0x86, 0x87):  # TUPLE1-3
                count = opcode - 0x84
                items = tuple(stack[-count:])
                del stack[-count:]
                stack.append(items)
            elif opcode == 0x6C:  # LIST
                stack.append(self._pop_mark())
            elif opcode == 0x64:  # DICT
                items = self._pop_mark()
                stack.append({items[i]: items[i + 1] for i in range(0, len(items) - 1, 2)})
            elif opcode == 0x43:  # SHORT_BINBYTES
                stack.append(self._take(self._take(1)[0]))
            elif opcode == 0x42:  # BINBYTES
                stack.append(self._take(struct.unpack("<I", self._take(4))[0]))
            elif opcode == 0x8E:  # BINBYTES8
                stack.append(self._take(struct.unpack("<Q", self._take(8))[0]))
            elif opcode == 0x96:  # BYTEARRAY8
                stack.append(bytearray(self._take(struct.unpack("<Q", self._take(8))[0])))
            elif opcode == 0x8F:  # EMPTY_SET
                stack.append(set())
            elif opcode == 0x90:  # ADDITEMS
                items = self._pop_mark()
                stack[-1].update(items)
            elif opcode == 0x91:  # FROZENSET
                stack.append(frozenset(self._pop_mark()))
            elif opcode == 0x30:  # POP
                if stack and stack[-1] is MARK:
                    self._pop_mark()
                else:
                    stack.pop()
            elif opcode == 0x31:  # POP_MARK
                self._pop_mark()
            elif opcode == 0x32:  # DUP
                stack.append(stack[-1])
            elif opcode == 0x70:  # PUT (text)
                self._memo_put(int(self._line()), stack[-1])
            elif opcode == 0x67:  # GET (text)
                stack.append(self._memo_get(int(self._line())))
            elif opcode in _REFUSED:
                detail = ""
                if opcode == ord("c"):
                    detail = f"; this pickle wants {self._line().decode(errors='replace')}.{self._line().decode(errors='replace')}"
                elif opcode == 0x93 and len(stack) >= 2:
                    detail = f"; this pickle wants {stack[-2]}.{stack[-1]}"
                raise SnapshotReadError(f"a memory snapshot holds only plain data{detail or f'; the pickle uses {_REFUSED[opcode]}'}")
            else:
                raise SnapshotReadError(
                    f"{self.source}: not a memory snapshot this reader knows (pickle opcode {opcode:#04x})"
                )

    def _text(self, raw: bytes) -> str:
        try:
            return raw.decode("utf-8", "surrogatepass")
        except UnicodeDecodeError as exc:
            raise SnapshotReadError(f"{self.source}: a string in the pickle is not UTF-8") from exc

    def _memo_get(self, index: int) -> Any:
        try:
            value = self.memo[index]
        except IndexError:
            raise SnapshotReadError(f"{self.source}: the pickle refers to memo slot {index}, never filled") from None
        if value is DROPPED:
            raise SnapshotReadError(
                f"{self.source}: the pickle refers back to a trace entry; PyTorch's snapshots never do"
            )
        return value

    def _memo_put(self, index: int, value: Any) -> None:
        memo = self.memo
        if index >= len(memo) + 2**16:  # picklers number their memo in order
            raise SnapshotReadError(f"{self.source}: a corrupt pickle (memo slot {index:,})")
        if index >= len(memo):
            memo.extend([None] * (index + 1 - len(memo)))
        memo[index] = value

    def _pop_mark(self) -> list[Any]:
        if not self.marks:
            raise SnapshotReadError(f"{self.source}: a malformed pickle (no mark)")
        start = self.marks.pop()
        items = self.stack[start + 1:]
        del self.stack[start:]
        return items

    def _new_list(self) -> list[Any]:
        """An empty list; the snapshot's 'segments' and each device's trace list are sinks."""
        stack = self.stack
        # The top-level dict's items are on the stack above its mark: [dict, MARK, key, value, ...];
        # a key of it sits at an even place, with no other mark open (only its device list's).
        top_level = self.marks[:1] == [1] and type(stack[0]) is dict
        if top_level and len(self.marks) == 1 and len(stack) % 2 and stack[-1] == "segments":
            return _SinkList(None)
        depth = len(stack) - 1
        earlier = 0
        while depth >= 0 and type(stack[depth]) is _SinkList and stack[depth].device is not None:
            depth, earlier = depth - 1, earlier + 1
        open_marks = [1]
        if depth >= 0 and stack[depth] is MARK:
            open_marks.append(depth)
            depth -= 1
        if (
            top_level
            and self.marks == open_marks
            and depth >= 3
            and depth % 2
            and type(stack[depth]) is list
            and stack[depth - 1] == "device_traces"
        ):
            return _SinkList(len(stack[depth]) + earlier)
        return []

    def _extend(self, target: Any, items: list[Any]) -> None:
        if type(target) is _SinkList:
            for item in items:
                self._hand_over(target, item)
        elif isinstance(target, list):
            target.extend(items)
        else:
            raise SnapshotReadError(f"{self.source}: a malformed pickle (appends to a {type(target).__name__})")

    def _hand_over(self, sink: _SinkList, item: Any) -> None:
        if sink.device is None:
            if isinstance(item, dict):
                self.on_segment(item)
            return
        if isinstance(item, dict):
            frames = item.get("frames")
            if isinstance(frames, (list, tuple)):
                frames = self._traceback_of(frames)
            self.events += 1
            self._handler(sink.device)(item.get("action"), item.get("addr"), item.get("size"), frames, item.get("category"))
            self._learn_layout(item)

    def _entry_done(self) -> None:
        """A trace entry the general machine built, complete when it sits right above its sink's
        mark and the next opcode starts another entry or ends the batch: hand it over now, so
        entries keep their order with those read by the pattern."""
        stack = self.stack
        if len(stack) >= 3 and stack[-2] is MARK and type(stack[-3]) is _SinkList and stack[-3].device is not None:
            if self.pos >= len(self.buffer):
                self._fill(1)
            if self.pos < len(self.buffer) and self.buffer[self.pos] in (0x7D, 0x65, 0x95):  # '}', 'e', FRAME
                self._hand_over(stack[-3], stack.pop())

    def _handler(self, device: int) -> OnEntry:
        handler = self.entry_handlers.get(device)
        if handler is None:
            handler = self.entry_handlers[device] = self.on_trace(device)
        return handler

    def _traceback_of(self, frames: list[Any] | tuple[Any, ...]) -> tuple[Any, ...]:
        key = struct.pack(f"<{len(frames)}Q", *map(id, frames))  # memo values: alive, so ids are stable
        shared = self.traceback_ids.get(key)
        if shared is None:
            shared = self.traceback_ids[key] = tuple(frames)
        return shared

    def _learn_layout(self, entry: dict[str, Any]) -> None:
        """An entry the pattern could not read: learn its layout, when its keys are memo strings."""
        keys = tuple(entry)
        if keys in self.layout_keys or len(self.layouts) >= 16 or not all(isinstance(k, str) for k in keys):
            return
        self.layout_keys.add(keys)
        refs = []
        for key in keys:
            for index in range(len(self.memo) - 1, -1, -1):
                if self.memo[index] is key:
                    refs.append(_ref_bytes(index))
                    break
            else:
                return
        self.layouts.append(_Layout(entry, refs))

    def _fast_entries(self, device: int) -> None:
        """Trace entries read whole by their layout's pattern, straight from the buffer."""
        if not self.layouts:
            return
        memo_append, on_entry, values_get = self.memo.append, self._handler(device), self.values.get
        layout = self.layouts[-1]
        match_entry, fields = layout.pattern.match, layout.groups
        dropped = DROPPED
        buffer, pos = self.buffer, self.pos
        refill_at = len(buffer) - 65536 if not self.eof else len(buffer)
        entries = 0
        try:
            while True:
                if pos > refill_at:
                    self.pos = pos
                    self._fill(CHUNK)
                    buffer, pos = self.buffer, self.pos
                    refill_at = len(buffer) - 65536 if not self.eof else len(buffer)
                match = match_entry(buffer, pos)
                if match is None:
                    for other in self.layouts:  # entries of another layout (the export's alloc vs free)
                        match = other.pattern.match(buffer, pos)
                        if match is not None:
                            layout = other
                            match_entry, fields = layout.pattern.match, layout.groups
                            break
                    else:
                        if pos < len(buffer) and buffer[pos] == 0x95:  # a FRAME between two entries
                            pos += 9
                            continue
                        return
                action, address, size, frames, category = match.group(*fields)
                memo_append(dropped)  # the entry's own slot
                first = frames[0]
                if first == 0x5D:  # "]": a new traceback, memoized where the list was
                    frames = self._new_traceback(frames)
                    memo_append(frames)
                elif first == 0x6A or first == 0x68:  # a list met before (each is met once or twice)
                    frames = self._value(frames, remember=False)
                else:
                    frames = values_get(frames, dropped)
                    if frames is dropped:
                        frames = self._value(match.group(fields[3]))
                # Inlined, not a loop over the fields: this runs once per trace entry.
                action = values_get(action, dropped)
                if action is dropped:
                    action = self._value(match.group(fields[0]))
                address = values_get(address, dropped)
                if address is dropped:
                    address = self._value(match.group(fields[1]))
                size = values_get(size, dropped)
                if size is dropped:
                    size = self._value(match.group(fields[2]))
                category = self._value(category) if category else None
                pos = match.end()
                entries += 1
                on_entry(action, address, size, frames, category)
        finally:
            self.pos = pos
            self.events += entries

    def _value(self, raw: bytes, remember: bool = True) -> Any:
        """A scalar or memo reference the pattern read, decoded; remembered by its bytes (a memo
        slot is filled once, so a reference's bytes always mean the same value)."""
        first = raw[0]
        if first == 0x68 or first == 0x6A:
            value = self._memo_get(raw[1] if first == 0x68 else int.from_bytes(raw[1:], "little"))
            if type(value) is list:  # a traceback the general machine read first
                value = self._traceback_of(value)
        elif first == 0x4B:
            value = raw[1]
        elif first == 0x4D or first == 0x4A:
            value = int.from_bytes(raw[1:], "little", signed=first == 0x4A)
        elif first == 0x8A:
            value = int.from_bytes(raw[2:], "little", signed=True)
        elif first == 0x4E:
            value = None
        elif first == 0x88 or first == 0x89:
            value = first == 0x88
        else:
            value = struct.unpack(">d", raw[1:])[0]
        if remember:
            if len(self.values) >= 1 << 20:  # addresses and sizes of a long trace: keep the cache bounded
                self.values.clear()
            self.values[raw] = value
        return value

    def _new_traceback(self, raw: bytes) -> tuple[Any, ...]:
        """A new list of frame references, as the tuple shared by every list of the same bytes."""
        shared = self.tracebacks.get(raw)
        if shared is None:
            if len(self.tracebacks) >= 1 << 18:
                self.tracebacks.clear()
            shared = self.tracebacks[raw] = self._traceback_of(self._refs(raw))
        return shared

    def _refs(self, raw: bytes) -> list[Any]:
        """The memo values a new list of references names (`]` MEMOIZE, then `(` refs `e`, or a
        ref and `a`, or nothing)."""
        body = raw[3:-1] if raw[2:3] == b"(" else raw[2:-1]
        values = []
        index = 0
        while index < len(body):
            if body[index] == 0x68:
                values.append(self._memo_get(body[index + 1]))
                index += 2
            else:
                values.append(self._memo_get(int.from_bytes(body[index + 1:index + 5], "little")))
                index += 5
        return values


def stream_snapshot(path: Path, on_segment: OnSegment, on_trace: OnTrace) -> int:
    """Read the snapshot at `path` (gzipped too), calling back for each segment and trace entry.
    Returns the number of trace entries. Raises SnapshotReadError or OSError."""
    with open(path, "rb") as raw:
        head = raw.read(2)
        raw.seek(0)
        handle: IO[bytes] = gzip.GzipFile(fileobj=raw) if head == b"\x1f\x8b" else raw
        if handle.read(1) != b"\x80":
            raise SnapshotReadError(f"{path}: not a pickle")
        stream = SnapshotStream(handle, on_segment, on_trace, str(path))
        stream.buffer, stream.pos = b"\x80", 0
        try:
            stream.run()
        except ValueError as exc:
            if type(exc) is not ValueError:  # said already (SnapshotReadError, the caller's own)
                raise
            raise SnapshotReadError(f"{path}: unreadable pickle: {exc}") from exc
        except (OSError, EOFError, zlib.error, struct.error, IndexError, KeyError, TypeError, AttributeError,
                OverflowError) as exc:
            raise SnapshotReadError(f"{path}: unreadable pickle: {type(exc).__name__}: {exc}") from exc
        top = stream.stack[-1] if stream.stack else None
        if not isinstance(top, dict) or "device_traces" not in top or "segments" not in top:
            raise SnapshotReadError(f"{path}: a pickle, but not a CUDA memory snapshot (no segments/device_traces)")
        return stream.events
