"""How `oom-lsp explain` scales with a snapshot's size (issue 32 asks a 2 GB snapshot in under
30 s and 1 GB of RSS): writes a snapshot of about --mb megabytes as `torch.cuda.memory.
_dump_snapshot` would, runs `oom-lsp explain FILE --format json` on it, and prints the seconds and
the child's peak RSS (from wait4), next to the readers a user has instead, on the same file when
their projected RSS fits this machine: Python's own unpickler (`pickle.load`, where every other
reader starts) and PyTorch's `python -m torch.cuda._memory_viz trace_plot` (the page of
pytorch.org/memory_viz, whose JavaScript then parses the whole file again in the browser).

    .venv/bin/python bench/snapshot_explain_size.py --mb 2048

What the file holds, and why: a training loop recorded with `_record_memory_history()` (its
defaults: stacks="all", context="all"). Each allocation has its own traceback, Python frames and
C++ frames (--depth, 48 by default: about 12 Python frames and 36 C++ frames from the training
loop down to the CUDA caching allocator); PyTorch symbolizes each distinct frame once and each
traceback is a list of references to those frames (`py_symbolize`), so the same call site gives
lists with the same references. A free records its own traceback (free_requested), and its
free_completed entry shares that list; a segment_alloc shares the allocation's list. The
segments at the end hold the blocks still live (active_allocated), with their tracebacks.
The bytes are written as CPython's pickler writes them (protocol 4: memoized strings, dicts and
lists, batches of 1000, 64 KiB frames) but streamed, since pickling a 2 GB object graph needs
~25 GB here; `tests/profiling/test_snapshot_pickle.py` checks the writer against `pickle.loads`.
"""

from __future__ import annotations

import argparse
import os
import random
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

FRAME_TARGET = 64 * 1024


class StreamingPickler:
    """Protocol 4 bytes for dicts, lists, strings and ints, as CPython's pickler writes them (each
    new str, dict and list memoized, repeats as BINGET/LONG_BINGET), without holding the object
    graph: the caller writes containers piece by piece."""

    def __init__(self, out: IO[bytes]) -> None:
        self.out = out
        self.frame = bytearray()
        self.memo: dict[int, int] = {}  # id(obj) -> memo index, for objects the caller keeps alive
        self.shareable: set[int] = set()  # ids of containers a later value may refer to
        self.count = 0
        self.out.write(b"\x80\x04")

    def commit(self, force: bool = False) -> None:
        if self.frame and (force or len(self.frame) >= FRAME_TARGET):
            self.out.write(b"\x95" + struct.pack("<Q", len(self.frame)) + self.frame)
            self.frame = bytearray()

    def memoize(self, obj: Any = None) -> None:
        """A memo slot for obj; remembered by id only for strings and containers the caller
        shares (and keeps alive while shared): a dead object's id may be reused."""
        self.frame += b"\x94"
        if obj is not None and (isinstance(obj, str) or id(obj) in self.shareable):
            self.memo[id(obj)] = self.count
        self.count += 1

    def share(self, obj: Any) -> None:
        self.shareable.add(id(obj))

    def forget(self, obj: Any) -> None:
        self.shareable.discard(id(obj))
        self.memo.pop(id(obj), None)

    def ref(self, obj: Any) -> bool:
        index = self.memo.get(id(obj))
        if index is None:
            return False
        self.frame += b"h" + bytes([index]) if index < 256 else b"j" + struct.pack("<I", index)
        return True

    def string(self, text: str) -> None:
        if self.ref(text):
            return
        raw = text.encode()
        assert len(raw) < 256
        self.frame += b"\x8c" + bytes([len(raw)]) + raw
        self.memoize(text)

    def integer(self, value: int) -> None:
        if 0 <= value < 256:
            self.frame += b"K" + bytes([value])
        elif 0 <= value < 65536:
            self.frame += b"M" + struct.pack("<H", value)
        elif -(2**31) <= value < 2**31:
            self.frame += b"J" + struct.pack("<i", value)
        else:
            raw = value.to_bytes((value.bit_length() + 8) // 8, "little", signed=True)
            self.frame += b"\x8a" + bytes([len(raw)]) + raw

    def value(self, value: Any) -> None:
        if isinstance(value, str):
            self.string(value)
        elif isinstance(value, bool) or value is None:
            self.frame += {None: b"N", True: b"\x88", False: b"\x89"}[value]
        elif isinstance(value, int):
            self.integer(value)
        elif isinstance(value, dict):
            self.dict(value)
        elif isinstance(value, (list, tuple)):
            self.list(value)
        else:
            raise TypeError(type(value))

    def dict(self, value: dict[str, Any]) -> None:
        if self.ref(value):
            return
        self.frame += b"}"
        self.memoize(value)
        items = list(value.items())
        if len(items) == 1:
            self.value(items[0][0])
            self.value(items[0][1])
            self.frame += b"s"
        elif items:
            for start in range(0, len(items), 1000):
                self.frame += b"("
                for key, item in items[start:start + 1000]:
                    self.value(key)
                    self.value(item)
                    self.commit()
                self.frame += b"u"

    def list(self, value: list[Any] | tuple[Any, ...]) -> None:
        if self.ref(value):
            return
        self.frame += b"]"
        self.memoize(value)
        self.items(value)

    def items(self, values: list[Any] | tuple[Any, ...]) -> None:
        """The items of the list just opened: one APPEND, or batches of 1000 between MARK and
        APPENDS (a frame may end after any item, as CPython's does)."""
        if len(values) == 1:
            self.value(values[0])
            self.frame += b"a"
        elif values:
            for start in range(0, len(values), 1000):
                self.frame += b"("
                for item in values[start:start + 1000]:
                    self.value(item)
                    self.commit()
                self.frame += b"e"


class TrainingRecording:
    """A recorded training loop: call sites (distinct Python stacks over a shared C++ tail), each
    allocation a new traceback of its site, frees with their own traceback."""

    def __init__(self, depth: int, seed: int = 0) -> None:
        self.random = random.Random(seed)
        python_depth = max(2, depth // 4)
        cpp_depth = max(1, depth - python_depth)
        cpp = [
            {"name": f"c10::cuda::CUDACachingAllocator::Native::malloc#{i}", "filename": "??", "line": 0}
            for i in range(cpp_depth)
        ]
        loop = {"filename": "/home/user/project/train.py", "line": 212, "name": "<module>"}
        self.sites: list[list[dict[str, Any]]] = []
        for site in range(240):
            role = "optim" if site % 12 == 0 else "autograd" if site % 3 == 0 else "model"
            python = [
                {"filename": f"/usr/lib/python3/site-packages/torch/{role}/f{site % 7}.py", "line": 100 + i, "name": "op"}
                for i in range(python_depth - 2)
            ]
            python.append({"filename": f"/home/user/project/model_{site % 17}.py", "line": 30 + site, "name": "forward"})
            python.append(loop)
            self.sites.append(cpp + python)  # innermost first, as PyTorch records them
        self.frames = [frame for site in self.sites for frame in site]

    def traceback(self, site: int) -> list[dict[str, Any]]:
        return list(self.sites[site])  # a new list per allocation (its own CapturedTraceback)

    def events(self, allocations: int):
        """(action, addr, size, traceback) in order, and the blocks live at the end. Each call site
        allocates its own tensor size, step after step, and the caching allocator hands a freed
        block's address to the next request of its size, as a training loop's trace shows."""
        live: dict[int, tuple[int, list[dict[str, Any]]]] = {}
        cached: dict[int, list[int]] = {}  # size -> addresses of freed blocks
        sizes = [512 * self.random.randrange(1, 8192) for _ in self.sites]
        address = 0x7F0000000000
        for index in range(allocations):
            site = self.random.randrange(len(self.sites))
            size = sizes[site]
            frames = self.traceback(site)
            pool = cached.get(size)
            if pool:
                block = pool.pop()
            else:
                block = address
                address += size
                yield ("segment_alloc", block, size, frames)
            yield ("alloc", block, size, frames)
            live[block] = (size, frames)
            while len(live) > 400 or (live and self.random.random() < 0.45):
                freed = next(iter(live))
                freed_size, _ = live.pop(freed)
                free_frames = self.traceback(self.random.randrange(len(self.sites)))
                yield ("free_requested", freed, freed_size, free_frames)
                yield ("free_completed", freed, freed_size, free_frames)
                cached.setdefault(freed_size, []).append(freed)
        self.live_at_end = live


def write_snapshot(path: Path, megabytes: float, depth: int = 48, seed: int = 0) -> tuple[int, int]:
    """A snapshot of about `megabytes`; returns (allocations, trace entries). The number of
    allocations comes from the bytes the 20,000 allocations after the first 20,000 add."""
    import io

    sizes = []
    for count in (20000, 40000):
        probe = io.BytesIO()
        write_allocations(probe, count, depth, seed)
        sizes.append(probe.tell())
    per_allocation = (sizes[1] - sizes[0]) / 20000
    allocations = max(1, int((megabytes * 2**20 - sizes[0]) / per_allocation) + 20000)
    if megabytes * 2**20 < sizes[0]:
        allocations = max(1, int(megabytes * 2**20 / (sizes[0] / 20000)))
    with open(path, "wb") as out:
        return allocations, write_allocations(out, allocations, depth, seed)


def write_allocations(out: IO[bytes], allocations: int, depth: int, seed: int) -> int:
    """The snapshot of `allocations` allocations into out; returns the number of trace entries."""
    recording = TrainingRecording(depth, seed)
    # First pass: the blocks live at the end (the segments come first in the file).
    for _ in recording.events(allocations):
        pass
    live_at_end = recording.live_at_end
    recording = TrainingRecording(depth, seed)
    keys = ("action", "addr", "size", "stream", "time_us", "frames", "compile_context", "user_metadata")
    pickler = StreamingPickler(out)
    for frame in recording.frames:  # symbolized once, shared by every traceback
        pickler.share(frame)
    pickler.frame += b"}"
    pickler.memoize()
    pickler.frame += b"("
    pickler.string("segments")
    pickler.frame += b"]"
    pickler.memoize()
    segments = [
        {
            "device": 0, "address": addr, "total_size": size, "allocated_size": size, "active_size": size,
            "requested_size": size, "stream": 0, "segment_type": "large", "segment_pool_id": [0, 0],
            "is_expandable": False, "frames": [],
            "blocks": [{"address": addr, "size": size, "requested_size": size, "state": "active_allocated", "frames": []}],
        }
        for addr, (size, _) in live_at_end.items()
    ]
    pickler.items(segments)
    pickler.string("device_traces")
    pickler.frame += b"]"
    pickler.memoize()
    pickler.frame += b"]"
    pickler.memoize()
    entries = 0
    batch = 0
    for action, addr, size, frames in recording.events(allocations):
        if batch == 0:
            pickler.frame += b"("
        if action in ("segment_alloc", "free_requested"):
            pickler.share(frames)  # the alloc / free_completed right after refers to the same list
        pickler.dict(dict(zip(keys, (action, addr, size, 0, entries, frames, "", ""))))
        pickler.commit()
        if action in ("alloc", "free_completed"):
            pickler.forget(frames)
        entries += 1
        batch += 1
        if batch == 1000:
            pickler.frame += b"e"
            batch = 0
    if batch:
        pickler.frame += b"e"
    pickler.frame += b"a"  # the one device's trace into device_traces
    pickler.string("allocator_settings")
    pickler.dict({"PYTORCH_CUDA_ALLOC_CONF": "", "max_split_size": -1})
    pickler.string("external_annotations")
    pickler.frame += b"]"
    pickler.memoize()
    pickler.frame += b"u."
    pickler.commit(force=True)
    return entries


def _measure(command: list[str]) -> tuple[float, float, int]:
    started = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    return time.perf_counter() - started, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=float, default=100)
    parser.add_argument("--depth", type=int, default=48, help="frames per traceback (Python and C++)")
    parser.add_argument("--keep", type=Path, help="write the snapshot here and keep it")
    parser.add_argument("--no-peer", action="store_true", help="skip pickle.load")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="oom-lsp-snapshot-size-") as tmp:
        path = args.keep or Path(tmp) / "big.pickle"
        started = time.perf_counter()
        allocations, entries = write_snapshot(path, args.mb, args.depth)
        megabytes = path.stat().st_size / 2**20
        print(
            f"snapshot: {megabytes:,.0f} MiB, {allocations:,} allocations, {entries:,} trace entries, "
            f"{args.depth} frames per traceback (written in {time.perf_counter() - started:.0f} s)"
        )
        seconds, rss_mb, code = _measure([sys.executable, "-m", "oom_lsp", "explain", str(path), "--format", "json"])
        print(f"oom-lsp explain: {seconds:.1f} s, peak RSS {rss_mb:,.0f} MiB, exit {code}")
        print(f"  {megabytes / seconds:.0f} MiB/s; goal at 2 GB: 30 s and 1 GB of RSS")
        loader = "import pickle,sys; pickle.load(open(sys.argv[1],'rb'))"
        if args.no_peer:
            return 0
        # Measured on this layout: pickle.load holds ~3 bytes per byte of pickle, trace_plot ~9.
        if megabytes * 3.2 / 1024 > 12:
            print(f"pickle.load: not run (about {megabytes * 3.2 / 1024:.0f} GB of RSS at this size)")
            return 0
        seconds, rss_mb, code = _measure([sys.executable, "-c", loader, str(path)])
        print(f"pickle.load (the object graph only, no analysis): {seconds:.1f} s, peak RSS {rss_mb:,.0f} MiB, exit {code}")
        if megabytes * 9.5 / 1024 > 12:
            print(f"_memory_viz trace_plot: not run (about {megabytes * 9.5 / 1024:.0f} GB of RSS at this size)")
            return 0
        page = Path(tmp) / "trace_plot.html"
        seconds, rss_mb, code = _measure(
            [sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", str(path), "-o", str(page)]
        )
        print(f"PyTorch's _memory_viz trace_plot: {seconds:.1f} s, peak RSS {rss_mb:,.0f} MiB, exit {code}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
