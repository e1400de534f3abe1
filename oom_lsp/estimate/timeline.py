"""The traced step's memory timeline (--snapshot, --html): each allocation and free of the
fake-tensor trace in order, with its category, op, phase, user line and module
(harness/tracker.py records them), and its export to PyTorch's memory-snapshot format, the
pickle `torch.cuda.memory._snapshot()` gives and `torch.cuda._memory_viz` / pytorch.org/memory_viz
read. Pure: no torch."""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .results import Prediction, Trace

# Addresses of the export: made up (the trace has no device), 512-byte aligned as CUDA's, and
# reused for a later allocation of the same size, as the caching allocator reuses blocks (the
# viewer draws each address as a block; JavaScript numbers stay exact below 2**53).
BASE_ADDRESS = 0x7F0000000000
WORKSPACE_SERIAL = -(2**62)


@dataclass(frozen=True)
class Alloc:
    serial: int
    size: int
    category: str
    op: str
    phase: str
    place: str  # "file:line" of the user's code, or ""
    module: str


@dataclass(frozen=True)
class Free:
    serial: int
    size: int


@dataclass(frozen=True)
class Recategorise:
    """A live storage is found to be held as `category` (the first step's optimizer state is
    made as temporaries and known as state once the optimizer keeps it)."""

    serial: int
    category: str
    size: int = 0


@dataclass
class Timeline:
    """The allocations of the traced steps. `workspace_bytes`: what the prediction adds to the
    trace's peak for the whole step (cuBLAS's workspace, kept from the first matmul): drawn as
    one allocation at the start, so the timeline's peak is the prediction's allocated peak."""

    events: list[list[Any]]
    workspace_bytes: int
    peak_bytes: int  # the prediction's allocated peak
    workspace_line: str = ""  # "file:line" of the first matrix product, where CUDA makes the workspace

    @classmethod
    def from_trace(cls, trace: Trace, prediction: Prediction) -> Timeline:
        return cls(
            list(trace.timeline or []),
            max(0, prediction.peak_bytes - trace.peak_bytes),
            prediction.peak_bytes,
            trace.first_matmul_line,
        )

    def __iter__(self) -> Iterator[Alloc | Free | Recategorise]:
        if self.workspace_bytes:
            yield Alloc(
                WORKSPACE_SERIAL, self.workspace_bytes, "workspaces", "cublas workspace", "", self.workspace_line, ""
            )
        for event in self.events:
            if len(event) == 2:
                yield Free(event[0], -event[1])
            elif len(event) == 3:
                yield Recategorise(event[0], event[2])
            else:
                yield Alloc(*event)

    def peak(self) -> tuple[int, int]:
        """(the highest running sum of allocated bytes, the index of the last event that reached it)."""
        current = peak = 0
        where = -1
        for index, event in enumerate(self):
            if isinstance(event, Alloc):
                current += event.size
            elif isinstance(event, Free):
                current -= event.size
            if current >= peak and current:  # the last time it is reached, as the estimate reports it
                peak, where = current, index
        return peak, where


def _frames(event: Alloc) -> list[dict[str, Any]]:
    """Innermost first, as PyTorch records them: the op, then the user's line (named by the
    module that ran it; the trace keeps no function names)."""
    frames = [{"filename": "<aten>", "line": 0, "name": event.op or "?"}]
    if event.place:
        file, _, line = event.place.rpartition(":")
        frames.append(
            {"filename": file, "line": int(line) if line.isdigit() else 0, "name": event.module or "<module>"}
        )
    return frames


def to_snapshot(timeline: Timeline) -> dict[str, Any]:
    """The timeline in the format of `torch.cuda.memory._snapshot()`: device 0's trace of
    alloc / free_requested / free_completed actions, and the segments (one per block still
    live at the end, as the allocator would hold them) with their blocks."""
    free_addresses: dict[int, list[int]] = {}
    live: dict[int, dict[str, Any]] = {}
    next_address = BASE_ADDRESS
    trace: list[dict[str, Any]] = []
    for time, event in enumerate(timeline):
        if isinstance(event, Alloc):
            pool = free_addresses.get(event.size)
            if pool:
                address = pool.pop()
            else:
                address = next_address
                next_address += -(-max(event.size, 1) // 512) * 512
            record = {
                "action": "alloc",
                "addr": address,
                "size": event.size,
                "stream": 0,
                "time_us": time,
                "frames": _frames(event),
                "category": event.category,
                "phase": event.phase,
            }
            live[event.serial] = record
            trace.append(record)
        elif isinstance(event, Recategorise):
            if event.serial in live:
                live[event.serial]["category"] = event.category
        elif isinstance(event, Free):
            record = live.pop(event.serial, None)
            if record is None:
                continue
            for action in ("free_requested", "free_completed"):
                trace.append(
                    {
                        "action": action,
                        "addr": record["addr"],
                        "size": record["size"],
                        "stream": 0,
                        "time_us": time,
                        "frames": record["frames"],
                    }
                )
            free_addresses.setdefault(record["size"], []).append(record["addr"])
    segments = [
        {
            "device": 0,
            "address": record["addr"],
            "total_size": record["size"],
            "allocated_size": record["size"],
            "active_size": record["size"],
            "requested_size": record["size"],
            "stream": 0,
            "segment_type": "large" if record["size"] > 1 << 20 else "small",
            "segment_pool_id": (0, 0),
            "is_expandable": False,
            "frames": record["frames"],
            "blocks": [
                {
                    "address": record["addr"],
                    "size": record["size"],
                    "requested_size": record["size"],
                    "state": "active_allocated",
                    "frames": record["frames"],
                }
            ],
        }
        for record in sorted(live.values(), key=lambda record: record["addr"])
    ]
    return {
        "segments": segments,
        "device_traces": [trace],
        "allocator_settings": {},
        "external_annotations": [],
    }


def active_peak(snapshot: dict[str, Any], device: int = 0) -> int:
    """The highest active memory of a snapshot's device trace, as PyTorch's viewer draws it: each
    alloc adds its size and each free_completed takes it off (memory allocated before recording
    started, which only the segments show, is not counted)."""
    current = peak = 0
    for event in snapshot["device_traces"][device]:
        if event["action"] == "alloc":
            current += event["size"]
        elif event["action"] == "free_completed":
            current -= event["size"]
        peak = max(peak, current)
    return peak


def write_snapshot(timeline: Timeline, path: Path) -> None:
    path.write_bytes(pickle.dumps(to_snapshot(timeline), protocol=4))
