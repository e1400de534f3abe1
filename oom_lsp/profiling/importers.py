"""`oom-lsp profile --import FILE`: a report from a profile someone already recorded.

No torch import: the files are read as data.

Supported:
* PyTorch chrome traces (`prof.export_chrome_trace(...)` with `profile_memory=True`): the
  "[memory]" instant events are replayed in time order (as the harness does with the live
  event tree). Steps come from oom-lsp's own step markers or from `ProfilerStep#N` spans
  (`torch.profiler.schedule` + `prof.step()`); otherwise the whole trace is one step. Lines come
  from the innermost user-file `python_function` span around each allocation (needs
  `with_stack=True`): a chrome trace names a function by its `def` line, not by the line that
  allocated, so `top_lines` point at functions here.
* CUDA memory snapshots (`torch.cuda.memory._dump_snapshot`, pickle with "segments" and
  "device_traces"): alloc / free_completed events give allocated bytes, segment_alloc /
  segment_free give reserved bytes, and each allocation's innermost user frame gives the exact
  line. Memory allocated before recording started is counted from the segments' active blocks
  where the trace does not explain it.

Not supported: Nsight Systems exports (`nsys export --type json` / sqlite). Their CUDA memory
records (with `--cuda-memory-usage=true`) carry neither the caching allocator's view nor
Python frames, so they cannot fill this report honestly; they are refused with that reason.
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oom_lsp.profiling.oom_messages import is_user_file
from oom_lsp.profiling.report import Artifacts, DeviceInfo, LineUsage, Report, StepStats
from oom_lsp.profiling.snapshot_pickle import SnapshotReadError, stream_snapshot
from oom_lsp.units import format_bytes

STEP_MARKER = re.compile(r"^oom_lsp\.step_end\.(\d+)$")
PROFILER_STEP = re.compile(r"^ProfilerStep#(\d+)$")
PYTHON_FUNCTION = re.compile(r"^(?P<file>.+)\((?P<line>\d+)\): (?P<function>.+)$")
TOP_LINES = 20


class ImportFormatError(ValueError):
    """The file is not a profile this importer can read; the message says why."""


def read_snapshot_file(path: Path) -> SnapshotExplanation:
    """A memory snapshot pickle (gzipped too): its report and the peak's bytes by holder. The file
    is streamed (snapshot_pickle): memory follows the blocks live at a time, not the file's size."""
    replay = SnapshotReplay()
    try:
        stream_snapshot(path, replay.on_segment, replay.on_trace)
    except SnapshotReadError as exc:
        raise ImportFormatError(str(exc)) from exc
    return replay.result(path)


def import_profile(path: Path) -> Report:
    with open(path, "rb") as handle:
        head = handle.read(2)
    if head[:1] == b"\x80" or (head == b"\x1f\x8b" and _gunzip_head(path) == b"\x80"):
        return read_snapshot_file(path).report
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    if raw[:6] == b"SQLite":
        raise ImportFormatError(_NSYS_REFUSAL)
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        data = _json_lines(raw)
    if isinstance(data, dict) and "traceEvents" in data:
        return import_chrome_trace(data, path)
    if isinstance(data, list) and data and isinstance(data[0], dict) and "traceEvents" not in data[0]:
        if any(k in data[0] for k in ("Type", "TraceProcessEvent", "CudaEvent", "data")):
            raise ImportFormatError(_NSYS_REFUSAL)
    raise ImportFormatError(
        f"{path}: not a PyTorch chrome trace (no traceEvents) nor a CUDA memory snapshot pickle"
    )


_NSYS_REFUSAL = (
    "Nsight Systems exports are not supported: their CUDA memory records have neither the PyTorch "
    "caching allocator's view (allocated vs reserved) nor Python frames. Record a PyTorch chrome trace "
    "(torch.profiler with profile_memory=True, then export_chrome_trace) or a memory snapshot "
    "(torch.cuda.memory._record_memory_history + _dump_snapshot) instead."
)


def _json_lines(raw: bytes) -> Any:
    try:
        return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()]
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ImportFormatError(f"not JSON, JSON lines nor a pickle: {exc}") from exc


def _gunzip_head(path: Path) -> bytes:
    try:
        with gzip.open(path, "rb") as handle:
            return handle.read(1)
    except (OSError, EOFError):
        return b""


def _replay(ops: list[tuple[int, int, Any]], baseline: int = 0) -> tuple[list[int], int, list[tuple[int, Any]]]:
    """Live bytes after each (address, +size or -1 for a free, attribution) op.

    Returns the running totals, the peak, and the (size, attribution) of the blocks live at
    the peak. Two passes, so a long climb to the peak costs no copies of the live set.
    """
    live: dict[int, int] = {}
    total, peak, peak_index = baseline, baseline, -1
    totals = []
    for index, (address, size, _) in enumerate(ops):
        if size >= 0:
            live[address] = size
            total += size
        elif address in live:  # a free of a block allocated before recording started
            total -= live.pop(address)
        totals.append(total)
        if total > peak:
            peak, peak_index = total, index
    at_peak: dict[int, tuple[int, Any]] = {}
    for address, size, where in ops[: peak_index + 1]:
        if size >= 0:
            at_peak[address] = (size, where)
        else:
            at_peak.pop(address, None)
    return totals, peak, list(at_peak.values())


def _top_lines(live: Iterable[tuple[int, Any]]) -> list[LineUsage]:
    lines: dict[tuple[str, int], LineUsage] = {}
    for size, where in live:
        if where is None:
            continue
        file, line, function = where
        usage = lines.setdefault((file, line), LineUsage(file, line, 0, function))
        usage.bytes += size
        usage.allocations += 1
    return sorted(lines.values(), key=lambda u: (-u.bytes, u.file, u.line))[:TOP_LINES]


def import_chrome_trace(data: dict[str, Any], path: Path) -> Report:
    events = data["traceEvents"]
    memory = [e for e in events if e.get("name") == "[memory]" and "Bytes" in e.get("args", {})]
    if not memory:
        raise ImportFormatError(f"{path}: a chrome trace without memory events: record it with profile_memory=True")
    cuda = any(e["args"].get("Device Type") == 1 for e in memory)
    device_type = 1 if cuda else 0
    memory = [e for e in memory if e["args"].get("Device Type") == device_type]
    memory.sort(key=lambda e: (e["ts"], e["args"]["Bytes"] > 0))

    markers = sorted(
        (int(m.group(1)), e["ts"]) for e in events if (m := STEP_MARKER.match(e.get("name", "")))
    )
    spans = sorted(
        (int(m.group(1)), e["ts"], e["ts"] + e.get("dur", 0))
        for e in events if (m := PROFILER_STEP.match(e.get("name", "")))
    )
    if markers:
        windows = [(float("-inf") if i == 0 else markers[i - 1][1], ts) for i, (_, ts) in enumerate(markers)]
        steps_from = "oom-lsp step markers"
    elif spans:
        windows = [(start, end) for _, start, end in spans]
        steps_from = "ProfilerStep spans"
    else:
        windows = [(float("-inf"), float("inf"))]
        steps_from = None

    functions = _user_functions(events)
    ops = [
        (e["args"]["Addr"], e["args"]["Bytes"], functions.innermost(e.get("tid"), e["ts"]))
        if e["args"]["Bytes"] > 0 else (e["args"]["Addr"], -1, None)
        for e in memory
    ]
    totals, peak, at_peak = _replay(ops)
    times = [e["ts"] for e in memory]
    step_peaks = []
    for start, end in windows:
        first, last = bisect.bisect_right(times, start), bisect.bisect_right(times, end)
        before = totals[first - 1] if first > 0 else 0  # what is live when the step starts
        step_peaks.append(max([before, *totals[first:last]]))

    notes = ["imported from a chrome trace: top_lines name the enclosing function (its def line)"]
    if steps_from:
        notes.append(f"steps from {steps_from}")
    else:
        notes.append("no step markers or ProfilerStep spans: the whole trace is one step")
    if not functions.any:
        notes.append("no python_function events (recorded without with_stack=True): no per-line attribution")
    props = data.get("deviceProperties") or []
    device = DeviceInfo("cuda" if cuda else "cpu")
    if cuda and props:
        device = DeviceInfo("cuda", props[0].get("name"), props[0].get("id"), props[0].get("totalGlobalMem"))
    return Report(
        script=None,
        status="imported",
        device=device,
        measured_with="chrome-trace",
        steps=[StepStats(i + 1, peak) for i, peak in enumerate(step_peaks)],
        peak_allocated=peak,
        top_lines=_top_lines(at_peak),
        artifacts=Artifacts(source=str(path)),
        notes=notes,
    )


class _UserFunctions:
    """The innermost user-file python_function span around a moment, per thread."""

    def __init__(self) -> None:
        self.by_thread: dict[Any, tuple[list[float], list[tuple[float, float, tuple[str, int, str]]]]] = {}
        self.any = False

    def innermost(self, tid: Any, ts: float) -> tuple[str, int, str] | None:
        starts, spans = self.by_thread.get(tid, ([], []))
        index = bisect.bisect_right(starts, ts) - 1
        while index >= 0:  # the latest-starting span that still covers ts is the innermost
            start, end, where = spans[index]
            if end >= ts:
                return where
            index -= 1
        return None


def _user_functions(events: list[dict[str, Any]]) -> _UserFunctions:
    result = _UserFunctions()
    per_thread: dict[Any, list[tuple[float, float, tuple[str, int, str]]]] = {}
    for event in events:
        if event.get("cat") != "python_function":
            continue
        result.any = True
        match = PYTHON_FUNCTION.match(event.get("name", ""))
        if not match or not is_user_file(match["file"]) or "/oom_lsp/profiling/" in match["file"]:
            continue
        where = (match["file"], int(match["line"]), match["function"])
        per_thread.setdefault(event.get("tid"), []).append((event["ts"], event["ts"] + event.get("dur", 0), where))
    for tid, spans in per_thread.items():
        spans.sort(key=lambda s: s[0])
        result.by_thread[tid] = ([s[0] for s in spans], spans)
    return result


@dataclass(frozen=True)
class HeldBy:
    """Bytes live at a snapshot's peak, grouped by what holds them (see `_holder`)."""

    holder: str
    bytes: int
    blocks: int

    def to_dict(self) -> dict[str, Any]:
        return {"holder": self.holder, "bytes": self.bytes, "blocks": self.blocks}


@dataclass(frozen=True)
class FailedAllocation:
    """An allocation the allocator could not serve (an "oom" entry of the trace): what it asked
    for, what the device had free, and the bytes live at that moment by the user line holding them."""

    requested: int
    device_free: int | None
    live: int
    top_lines: list[LineUsage]

    def to_dict(self) -> dict[str, Any]:
        return {
            "requested_bytes": self.requested,
            "device_free_bytes": self.device_free,
            "live_bytes": self.live,
            "top_lines": [usage.to_dict() for usage in self.top_lines],
        }


@dataclass(frozen=True)
class SnapshotExplanation:
    """A snapshot's report (its peak, top lines), the peak's bytes by holder, and the last
    allocation that failed when the recording holds one."""

    report: Report
    held_by: list[HeldBy]
    failed: FailedAllocation | None = None


# What holds a live block, where the snapshot says it. The estimate's export records each block's
# category; a real snapshot only its frames and its order: the optimizer's frames
# (torch/optim/), the backward's (torch/autograd/, the autograd engine), and the backward passes
# that count the steps (a block allocated in an earlier step than the peak's, and after the first
# backward, is kept across iterations; one of the peak's own step, outside the optimizer and the
# backward, is held by the autograd graph or is a temporary of that step).
OPTIMIZER = "the optimizer (its state)"
BACKWARD = "gradients (made by the backward)"
KEPT = "kept across iterations (allocated in an earlier step, still live)"
THIS_STEP = "this step's forward (the autograd graph, temporaries)"
BEFORE = "before the first backward (model, inputs, the first forward)"
NO_FRAMES = "unknown (no frames recorded)"
NO_STEPS = "your code (no backward frames recorded to tell the steps apart)"
CATEGORIES = {  # the estimate's export (`oom-lsp estimate --snapshot`)
    "parameters": "parameters",
    "unsharded_parameters": "parameters (unsharded)",
    "gradients": "gradients",
    "ddp_buckets": "DDP gradient buckets",
    "optimizer_state": OPTIMIZER,
    "activations": "the autograd graph (activations saved for backward)",
    "temporaries": "temporaries",
    "inputs": "inputs",
    "workspaces": "workspaces (cuBLAS)",
}


def _requested(block: dict[str, Any]) -> int:
    size = block.get("requested_size")
    if type(size) is not int:
        size = block.get("size")
    return size if type(size) is int else 0


def _role(frames: Any) -> str | None:
    """"optimizer" or "backward" when a frame says so; None otherwise."""
    for frame in frames or ():
        if not isinstance(frame, dict):
            continue
        filename, name = str(frame.get("filename", "")), str(frame.get("name", ""))
        if "/torch/optim/" in filename:
            return "optimizer"
        # The backward runs in the autograd engine (torch::autograd::Engine::evaluate_function on
        # CUDA's engine thread); torch::autograd::VariableType and THPVariable_* frames are every
        # forward op's dispatch, not the backward.
        if "/torch/autograd/" in filename or "autograd::engine" in name.lower():
            return "backward"
    return None


def read_snapshot(data: Any, path: Path) -> SnapshotExplanation:
    """The report and holders of a snapshot already in memory (the same replay as a file's)."""
    if not isinstance(data, dict) or "device_traces" not in data or "segments" not in data:
        raise ImportFormatError(f"{path}: a pickle, but not a CUDA memory snapshot (no segments/device_traces)")
    replay = SnapshotReplay()
    for segment in data["segments"]:
        replay.on_segment(segment)
    for device, trace in enumerate(data["device_traces"]):
        feed = replay.on_trace(device)
        for event in trace:
            feed(event.get("action"), event.get("addr"), event.get("size"), event.get("frames"), event.get("category"))
    return replay.result(path)


class _DeviceReplay:
    """One device's trace, replayed an entry at a time: live bytes, the last time their peak is
    reached (as the estimate takes it: a later step that reaches the same peak is the steady
    state, its optimizer state made), and the blocks live there. What was live at the peak is the live set now, less the
    blocks allocated since, plus those freed since (kept aside): no copy of the live set per new
    peak and no list of every event, so memory follows the live blocks, not the trace's length."""

    def __init__(self) -> None:
        self.events = 0
        self.live: dict[int, tuple[int, Any, Any, int]] = {}  # address -> (size, line, holder, step)
        self.total = self.peak = 0
        self.peak_step = 0
        self.allocated_since_peak: set[int] = set()
        self.freed_since_peak: dict[int, tuple[int, Any, Any, int]] = {}
        self.traced_alloc = 0
        self.traced_free = {"free_requested": 0, "free_completed": 0}
        # Frees count when completed (after the streams that used the block are done), or when
        # requested in a trace that records no completions (until the first completion is seen).
        self.completions_seen = False
        self.reserved = self.peak_reserved = 0  # relative to the reserved bytes when recording started
        self.backwards = 0  # backward passes started so far (a run of backward allocations)
        self.in_backward = False
        self.oom_events = 0
        self.failed: tuple[int, Any, int, list[tuple[int, Any, Any, int]]] | None = None
        self.attributions: dict[int, tuple[Any, str | None]] = {}  # id(frames) -> (line, role)

    def feed(self, action: Any, address: Any, size: Any, frames: Any, category: Any) -> None:
        self.events += 1
        if action == "alloc":
            frames = frames or ()
            attribution = self.attributions.get(id(frames))
            if attribution is None:
                attribution = self.attributions[id(frames)] = (_innermost_user_frame(frames), _role(frames))
            where, role = attribution
            if role == "backward" and not self.in_backward:
                self.backwards += 1
            self.in_backward = role == "backward" or (self.in_backward and role is None and not frames)
            step = self.backwards - self.in_backward
            holder = CATEGORIES.get(category or "", category) or role or (None if frames else NO_FRAMES)
            if type(size) is not int or type(address) is not int:
                raise ImportFormatError(f"trace entry {self.events}: an alloc without an integer addr and size")
            self.traced_alloc += size
            self.live[address] = (size, where, holder, step)
            self.total += size
            if self.total >= self.peak:
                self.peak, self.peak_step = self.total, step
                self.allocated_since_peak.clear()
                self.freed_since_peak.clear()
            else:
                self.allocated_since_peak.add(address)
        elif action == "free_completed" or action == "free_requested":
            if type(size) is not int:
                raise ImportFormatError(f"trace entry {self.events}: a {action} without an integer size")
            self.traced_free[action] += size
            if action == "free_completed":
                self.completions_seen = True
            elif self.completions_seen:
                return
            record = self.live.pop(address, None)
            if record is None:  # a block allocated before recording started, or freed on request
                return
            self.total -= record[0]
            if address in self.allocated_since_peak:
                self.allocated_since_peak.discard(address)
            else:
                self.freed_since_peak[address] = record
        elif action == "segment_alloc" and type(size) is int:
            self.reserved += size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        elif action == "segment_free" and type(size) is int:
            self.reserved -= size
        elif action == "oom":
            # PyTorch's "oom" entry: addr is the device's free bytes, size the request. The live set
            # is copied here only (the allocations that failed are few), the last one kept.
            self.oom_events += 1
            self.failed = (size, address, self.total, list(self.live.values()))

    def live_at_peak(self) -> list[tuple[int, Any, Any, int]]:
        if not self.peak:
            return []
        since = self.allocated_since_peak
        at_peak = [record for address, record in self.live.items() if address not in since]
        return at_peak + list(self.freed_since_peak.values())


class SnapshotReplay:
    """A snapshot's segments and trace entries, fed in the file's order (`on_segment`, and the
    handler of `on_trace` per device), and the report of its busiest device (`result`)."""

    def __init__(self) -> None:
        self.segments: dict[Any, list[int]] = {}  # device -> [active bytes, reserved bytes] at the end
        self.devices: dict[int, _DeviceReplay] = {}

    def on_segment(self, segment: dict[str, Any]) -> None:
        totals = self.segments.setdefault(segment.get("device"), [0, 0])
        blocks = segment.get("blocks") or ()
        # The trace records the bytes asked for (torch >= 2.1; a block's "size" is the allocator's
        # rounding of them, 26 MiB for 25), so the blocks count by theirs too: the bytes live before
        # recording started are then in the trace's unit.
        totals[0] += sum(
            _requested(b) for b in blocks if isinstance(b, dict) and b.get("state") == "active_allocated"
        )
        total_size = segment.get("total_size", 0)
        totals[1] += total_size if type(total_size) is int else 0

    def on_trace(self, device: int) -> Callable[[Any, Any, Any, Any, Any], None]:
        """Where the entries of a device's trace go (action, addr, size, frames, category)."""
        replay = self.devices.get(device)
        if replay is None:
            replay = self.devices[device] = _DeviceReplay()
        return replay.feed

    def result(self, path: Path) -> SnapshotExplanation:
        busiest = max(self.devices, key=lambda d: (self.devices[d].events, -d), default=None)
        if busiest is None or not self.devices[busiest].events:
            raise ImportFormatError(
                f"{path}: the snapshot has no trace events: record with torch.cuda.memory._record_memory_history() "
                "before the step"
            )
        replay = self.devices[busiest]
        active_at_end, reserved_at_end = self.segments.get(busiest, (0, 0))
        free_action = "free_completed" if replay.completions_seen else "free_requested"
        baseline = max(0, active_at_end - (replay.traced_alloc - replay.traced_free[free_action]))
        reserved_start = max(0, reserved_at_end - replay.reserved)
        peak = baseline + replay.peak
        peak_reserved = reserved_start + replay.peak_reserved
        live = replay.live_at_peak()
        held: dict[str, list[int]] = {}
        for size, _, holder, step in live:
            if holder == "optimizer":
                holder = OPTIMIZER
            elif holder == "backward":
                holder = BACKWARD
            elif holder is None and not replay.backwards:
                holder = NO_STEPS
            elif holder is None:
                peak_step = replay.peak_step
                holder = KEPT if 0 < step < peak_step else THIS_STEP if step == peak_step and step else BEFORE
            group = held.setdefault(holder, [0, 0])
            group[0] += size
            group[1] += 1
        if baseline:
            held["allocated before recording started"] = [baseline, 0]
        held_by = sorted((HeldBy(name, size, blocks) for name, (size, blocks) in held.items()), key=lambda h: -h.bytes)
        notes = ["imported from a CUDA memory snapshot: the whole recording is one step"]
        if baseline:
            notes.append(
                f"{format_bytes(baseline)} ({baseline:,} bytes) were allocated before recording started "
                "(no frames for them)"
            )
        if replay.oom_events:
            notes.append(f"the allocator recorded {replay.oom_events} out-of-memory event(s)")
        report = Report(
            script=None,
            status="imported",
            device=DeviceInfo("cuda", index=busiest),
            measured_with="memory-snapshot",
            steps=[StepStats(1, peak, peak_reserved)],
            peak_allocated=peak,
            peak_reserved=peak_reserved,
            top_lines=_top_lines((size, where) for size, where, _, _ in live),
            artifacts=Artifacts(snapshot=str(path), source=str(path)),
            notes=notes,
        )
        failed = None
        if replay.failed is not None:
            requested, device_free, live_then, blocks = replay.failed
            failed = FailedAllocation(
                requested if type(requested) is int else 0,
                device_free if type(device_free) is int else None,
                baseline + live_then,
                _top_lines((size, where) for size, where, _, _ in blocks),
            )
        return SnapshotExplanation(report, held_by, failed)


def _innermost_user_frame(frames: Iterable[dict[str, Any]]) -> tuple[str, int, str] | None:
    # Snapshot frames are innermost first (memory_viz reverses them to draw flame graphs).
    for frame in frames:
        if not isinstance(frame, dict):
            continue
        filename = frame.get("filename", "")
        if isinstance(filename, str) and filename.endswith(".py") and is_user_file(filename):  # C++ frames have no .py file
            line = frame.get("line", 0)
            return filename, line if isinstance(line, int) else 0, str(frame.get("name", ""))
    return None
