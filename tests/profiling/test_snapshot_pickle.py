"""The streaming snapshot reader (oom_lsp/profiling/snapshot_pickle.py) gives what Python's own
unpickler gives, entry for entry, on snapshots written by CPython's pickler (protocols 2-5) and by
the benchmark's streaming writer (PyTorch's layout: shared frames, 64 KiB frames cutting entries),
with buffers cut anywhere; its replay equals the two-pass replay it replaced; bad pickles get one
line and run nothing."""

import gzip
import importlib.util
import pickle
import random
from pathlib import Path

import pytest

from oom_lsp.profiling import snapshot_pickle
from oom_lsp.profiling.importers import (
    CATEGORIES,
    NO_FRAMES,
    ImportFormatError,
    _innermost_user_frame,
    _role,
    read_snapshot,
    read_snapshot_file,
)
from oom_lsp.profiling.snapshot_pickle import SnapshotReadError, stream_snapshot

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("snapshot_explain_size", ROOT / "bench" / "snapshot_explain_size.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _training_snapshot(seed=0, entries=3000, devices=1, frees="both"):
    """A snapshot as `torch.cuda.memory._snapshot()` returns it: frames symbolized once and shared,
    a traceback list per allocation, a free's list shared by its two entries, a segment_alloc's by
    its alloc, the blocks live at the end in the segments."""
    rng = random.Random(seed)
    frames = [
        {"filename": "/home/u/train.py", "line": 40 + i, "name": "step"} for i in range(5)
    ] + [
        {"filename": "/usr/lib/python3/site-packages/torch/autograd/graph.py", "line": 800, "name": "_engine_run_backward"},
        {"filename": "/usr/lib/python3/site-packages/torch/optim/adam.py", "line": 300, "name": "_single_tensor_adam"},
        {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"},
    ]
    traces, segments = [], []
    for device in range(devices):
        trace, live = [], {}
        address = 0x7F0000000000 + device * 2**36
        for _ in range(entries // 3):
            stack = [frames[7]] + rng.sample(frames[:7], 3)
            size = 512 * rng.randrange(1, 5000)
            if rng.random() < 0.1:
                trace.append({"action": "segment_alloc", "addr": address, "size": size, "stream": 0, "frames": stack})
            trace.append({"action": "alloc", "addr": address, "size": size, "stream": 0, "frames": stack,
                          "compile_context": "", "user_metadata": ""})
            live[address] = size
            address += size
            if live and rng.random() < 0.6:
                freed = rng.choice(list(live))
                freed_stack = [frames[7], frames[rng.randrange(5)]]
                actions = {"both": ("free_requested", "free_completed"), "requested": ("free_requested",)}[frees]
                for action in actions:
                    trace.append({"action": action, "addr": freed, "size": live[freed], "stream": 0,
                                  "frames": freed_stack, "compile_context": "", "user_metadata": ""})
                del live[freed]
            if rng.random() < 0.002:
                trace.append({"action": "oom", "addr": 0, "size": size, "stream": 0, "frames": stack})
        traces.append(trace)
        segments += [
            {"device": device, "address": addr, "total_size": size, "stream": 0, "segment_type": "large",
             "blocks": [{"address": addr, "size": size, "state": "active_allocated", "frames": []}]}
            for addr, size in list(live.items())[:50]
        ]
    return {"segments": segments, "device_traces": traces, "allocator_settings": {"max_split_size": -1},
            "external_annotations": []}


def _read(path):
    segments, entries = [], {}

    def on_trace(device):
        return lambda *fields: entries.setdefault(device, []).append(fields)

    stream_snapshot(path, segments.append, on_trace)
    return segments, entries


def _fields(entry):
    frames = entry.get("frames")
    return (entry.get("action"), entry.get("addr"), entry.get("size"), tuple(frames) if frames is not None else None,
            entry.get("category"))


def _same(data, segments, entries):
    assert segments == data["segments"]
    for device, trace in enumerate(data["device_traces"]):
        got = [(a, d, s, tuple(f) if f is not None else None, c) for a, d, s, f, c in entries.get(device, [])]
        assert got == [_fields(e) for e in trace]


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_reads_what_cpythons_pickler_wrote_entry_for_entry(tmp_path, protocol):
    data = _training_snapshot(seed=protocol, devices=2)
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    _same(pickle.loads(path.read_bytes()), *_read(path))


def test_buffers_cut_anywhere_give_the_same_entries(tmp_path, monkeypatch):
    data = _training_snapshot(seed=7, entries=1500)
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    for chunk in (1, 7, 4093):
        monkeypatch.setattr(snapshot_pickle, "CHUNK", chunk)
        _same(data, *_read(path))


def test_the_fast_path_reads_most_entries(tmp_path, monkeypatch):
    """The layout's pattern, not the general machine, reads the entries after the first few (a
    regression here is a 10x slower explain, with the same answers)."""
    data = _training_snapshot(seed=3, entries=6000)
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    general = []
    original = snapshot_pickle.SnapshotStream._hand_over

    def counting(self, sink, item):
        if sink.device is not None:
            general.append(item)
        return original(self, sink, item)

    monkeypatch.setattr(snapshot_pickle.SnapshotStream, "_hand_over", counting)
    _, entries = _read(path)
    assert len(entries[0]) == len(data["device_traces"][0])
    assert len(general) < len(entries[0]) / 20


def test_the_benchmarks_writer_is_a_pickle_of_pytorchs_layout(tmp_path):
    """bench/snapshot_explain_size.py streams the bytes of a big snapshot: Python's unpickler reads
    them, tracebacks share their frame dicts, and the reader agrees entry for entry (64 KiB frames
    cut entries in the middle there)."""
    bench = _bench()
    path = tmp_path / "big.pickle"
    with open(path, "wb") as out:
        count = bench.write_allocations(out, 1500, depth=12, seed=0)
    data = pickle.loads(path.read_bytes())
    trace = data["device_traces"][0]
    assert len(trace) == count > 3000
    frees = [e for e in trace if e["action"] == "free_requested"]
    assert frees and all(len(e["frames"]) == 12 for e in trace)
    first = [e for e in trace if e["action"] == "alloc"][:2]
    assert first[0]["frames"][0] is first[1]["frames"][0]  # one dict per distinct frame
    assert path.read_bytes().count(b"\x95") >= path.stat().st_size // 65536
    _same(data, *_read(path))


def _reference(data):
    """The replay oom-lsp had before it streamed (two passes over a list of every operation), taking
    the last time the peak is reached, as the estimate does."""
    trace = max(data["device_traces"], key=len)
    device = data["device_traces"].index(trace)
    segments = [s for s in data["segments"] if s.get("device") == device]
    free_action = "free_completed" if any(e["action"] == "free_completed" for e in trace) else "free_requested"
    traced = sum(e["size"] for e in trace if e["action"] == "alloc") - sum(
        e["size"] for e in trace if e["action"] == free_action
    )
    active = sum(b["size"] for s in segments for b in s["blocks"] if b["state"] == "active_allocated")
    baseline = max(0, active - traced)
    ops, live, total, peak, peak_index = [], {}, baseline, baseline, -1
    for event in trace:
        if event["action"] == "alloc":
            frames = event["frames"]
            ops.append((event["addr"], event["size"], _innermost_user_frame(frames)))
        elif event["action"] == free_action:
            ops.append((event["addr"], -1, None))
    for index, (address, size, _) in enumerate(ops):
        if size >= 0:
            live[address] = size
            total += size
        elif address in live:
            total -= live.pop(address)
        if total >= peak and size >= 0:  # the last time the peak is reached
            peak, peak_index = total, index
    at_peak = {}
    for address, size, where in ops[: peak_index + 1]:
        if size >= 0:
            at_peak[address] = (size, where)
        else:
            at_peak.pop(address, None)
    lines = {}
    for size, where in at_peak.values():
        if where:
            lines[where[:2]] = lines.get(where[:2], 0) + size
    return peak, sorted(lines.items(), key=lambda item: (-item[1], item[0]))[:20]


@pytest.mark.parametrize("frees", ["both", "requested"])
def test_the_one_pass_replay_equals_the_two_pass_one(tmp_path, frees):
    for seed in range(6):
        data = _training_snapshot(seed=seed, entries=2400, frees=frees)
        path = tmp_path / f"s{seed}.pickle"
        path.write_bytes(pickle.dumps(data, protocol=4))
        explained = read_snapshot_file(path)
        report, held_by = explained.report, explained.held_by
        peak, lines = _reference(data)
        assert report.peak_allocated == peak
        assert [((u.file, u.line), u.bytes) for u in report.top_lines] == lines
        assert sum(h.bytes for h in held_by) == peak
        assert read_snapshot(data, path).report.to_dict() == report.to_dict()


def test_holders_follow_the_frames_and_the_exports_categories(tmp_path):
    data = _training_snapshot(seed=11)
    for entry in data["device_traces"][0][::5]:
        if entry["action"] == "alloc":
            entry["category"] = "optimizer_state"
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(data, protocol=4))
    held_by = read_snapshot_file(path).held_by
    assert read_snapshot(data, path).held_by == held_by
    names = {h.holder for h in held_by}
    assert CATEGORIES["optimizer_state"] in names
    assert NO_FRAMES not in names
    assert _role([{"filename": "/x/torch/optim/sgd.py"}]) == "optimizer"


def test_gzipped_snapshots_stream_too(tmp_path):
    data = _training_snapshot(seed=5)
    plain, packed = tmp_path / "s.pickle", tmp_path / "s.pickle.gz"
    plain.write_bytes(pickle.dumps(data, protocol=4))
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert read_snapshot_file(packed).report.to_dict()["peak_allocated"] == read_snapshot_file(plain).report.peak_allocated


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


@pytest.mark.parametrize("protocol", [2, 4])
def test_a_pickle_that_would_run_code_runs_nothing(tmp_path, protocol):
    marker = tmp_path / "ran"
    path = tmp_path / "snapshot.pickle"
    data = _training_snapshot(seed=1, entries=30)
    data["device_traces"][0].append(_Payload(str(marker)))
    path.write_bytes(pickle.dumps(data, protocol=protocol))
    with pytest.raises(SnapshotReadError, match="holds only plain data; this pickle wants "):
        _read(path)
    assert not marker.exists()


def test_damaged_pickles_get_one_line_and_nothing_else(tmp_path):
    """Truncated, bit-flipped or garbage files: SnapshotReadError (or the replay's
    ImportFormatError) with a one-line message, never another exception."""
    raw = pickle.dumps(_training_snapshot(seed=2, entries=600), protocol=4)
    rng = random.Random(0)
    path = tmp_path / "snapshot.pickle"
    variants = [raw[:n] for n in (1, 2, 50, len(raw) // 2, len(raw) - 1)]
    for _ in range(150):
        damaged = bytearray(raw)
        for _ in range(rng.randrange(1, 4)):
            damaged[rng.randrange(2, len(damaged))] = rng.randrange(256)
        variants.append(bytes(damaged))
    variants.append(b"\x80\x04\x8d" + (2**60).to_bytes(8, "little"))
    for variant in variants:
        path.write_bytes(variant)
        try:
            read_snapshot_file(path)
        except ImportFormatError as exc:
            assert "\n" not in str(exc) and str(exc)


def test_a_pickle_that_is_not_a_snapshot(tmp_path):
    path = tmp_path / "x.pickle"
    path.write_bytes(pickle.dumps({"a": [1, 2, 3]}, protocol=4))
    with pytest.raises(SnapshotReadError, match="not a CUDA memory snapshot"):
        _read(path)
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [[]]}, protocol=4))
    with pytest.raises(ImportFormatError, match="no trace events"):
        read_snapshot_file(path)


def test_the_allocation_that_failed_is_explained_by_what_was_live_then(tmp_path):
    """PyTorch's "oom" entry (addr: the device's free bytes, size: the request): what was live at
    that moment, by line, beside the peak (which may have come earlier)."""
    line = lambda n: [{"filename": "/home/u/train.py", "line": n, "name": "step"}]  # noqa: E731
    trace = [
        {"action": "alloc", "addr": 1, "size": 5000, "frames": line(10)},
        {"action": "alloc", "addr": 2, "size": 200, "frames": line(11)},
        {"action": "free_requested", "addr": 1, "size": 5000, "frames": []},
        {"action": "free_completed", "addr": 1, "size": 5000, "frames": []},
        {"action": "alloc", "addr": 3, "size": 300, "frames": line(12)},
        {"action": "oom", "addr": 64, "size": 10**9, "frames": line(13)},
    ]
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps({"segments": [], "device_traces": [trace]}, protocol=4))
    explained = read_snapshot_file(path)
    assert explained.report.peak_allocated == 5200
    failed = explained.failed
    assert (failed.requested, failed.device_free, failed.live) == (10**9, 64, 500)
    assert [(u.line, u.bytes) for u in failed.top_lines] == [(12, 300), (11, 200)]
    assert read_snapshot({"segments": [], "device_traces": [trace[:3]]}, path).failed is None


def test_bytes_live_before_recording_count_in_the_traces_unit(tmp_path):
    """The trace records the bytes asked for; a segment's block has the allocator's rounding as
    "size" and the request as "requested_size": what was live before recording started is
    counted by the request, or every peak carries the rounding of the older blocks."""
    user = [{"filename": "/home/u/train.py", "line": 3, "name": "step"}]
    block = {"address": 0, "size": 26 << 20, "requested_size": 25 << 20, "state": "active_allocated"}
    traced = {"address": 1 << 30, "size": 1024, "requested_size": 1000, "state": "active_allocated"}
    snapshot = {  # the segments at the end hold every live block, the traced one too
        "segments": [{"device": 0, "total_size": 40 << 20, "blocks": [block, traced]}],
        "device_traces": [[{"action": "alloc", "addr": 1 << 30, "size": 1000, "frames": user}]],
    }
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    assert read_snapshot_file(path).report.peak_allocated == (25 << 20) + 1000
    del block["requested_size"], traced["requested_size"]  # older snapshots: the size is all there is
    path.write_bytes(pickle.dumps(snapshot, protocol=4))
    assert read_snapshot_file(path).report.peak_allocated == (26 << 20) + 1024


def test_a_forward_ops_autograd_dispatch_frame_is_not_the_backward():
    """With stacks="all" every op's C++ stack passes through torch::autograd::VariableType; only
    the autograd engine (the backward's thread) marks an allocation as the backward's."""
    forward = [
        {"filename": "??", "line": 0, "name": "torch::autograd::VariableType::(anonymous namespace)::mm(...)"},
        {"filename": "/home/u/model.py", "line": 12, "name": "forward"},
    ]
    backward = [{"filename": "??", "line": 0, "name": "torch::autograd::Engine::evaluate_function(...)"}]
    assert _role(forward) is None
    assert _role(backward) == "backward"
