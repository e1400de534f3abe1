"""`oom-lsp explain`, `compare` and `profile --import`, and the report schema (no subprocess, no torch)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from oom_lsp.cli import main
from oom_lsp.cli.profile import compare_reports
from oom_lsp.profiling.importers import ImportFormatError, import_profile
from oom_lsp.profiling.report import (
    SCHEMA_VERSION,
    DeviceInfo,
    LineUsage,
    Report,
    ReportError,
    StepStats,
    read_report,
)
from tests.profiling.test_oom_messages import TORCH_1_8, TORCH_2_2

MiB = 1024**2

LOG = f"""\
Traceback (most recent call last):
  File "/home/u/train.py", line 41, in <module>
    out = model(batch)
{TORCH_2_2}
"""


def test_explain_text(tmp_path, capsys):
    log = tmp_path / "run.log"
    log.write_text(LOG + "restarting\n" + TORCH_1_8 + "\n")
    assert main(["explain", str(log)]) == 0
    out = capsys.readouterr().out
    assert "out-of-memory error 1 of 2 (line 4):" in out
    assert "  tried to allocate: 22.00 MiB" in out
    assert "  failed at: /home/u/train.py:41 in <module>: out = model(batch)" in out
    assert "  hint: If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF" in out
    assert "out-of-memory error 2 of 2 (line 6):" in out
    assert "  reserved by PyTorch: 1.24 GiB" in out


def test_explain_json_from_stdin(monkeypatch, capsys):
    monkeypatch.setattr(sys, "stdin", _Stdin(LOG))
    assert main(["explain", "-", "--format", "json"]) == 0
    (oom,) = json.loads(capsys.readouterr().out)["ooms"]
    assert oom["tried_to_allocate"] == 22 * MiB
    assert oom["failing_frame"] == {"file": "/home/u/train.py", "line": 41, "function": "<module>", "code": "out = model(batch)"}


def test_explain_without_oom(tmp_path, capsys):
    log = tmp_path / "fine.log"
    log.write_text("epoch 1 loss 0.2\n")
    assert main(["explain", str(log)]) == 1
    assert "no out-of-memory error found" in capsys.readouterr().err
    assert main(["explain", str(tmp_path / "missing.log")]) == 2


class _Stdin:
    def __init__(self, text: str) -> None:
        self.text = text

    def read(self) -> str:
        return self.text


def make_report(steps: list[int], lines: list[tuple[int, int, str]]) -> Report:
    return Report(
        script="/p/train.py",
        status="completed",
        device=DeviceInfo("cuda", "NVIDIA A100-SXM4-40GB", 0, 40 * 1024**3),
        steps=[StepStats(i + 1, peak, peak + 64 * MiB, 0.5) for i, peak in enumerate(steps)],
        peak_allocated=max(steps),
        top_lines=[LineUsage("/p/train.py", line, size, "main", code) for line, size, code in lines],
    )


def test_compare_matches_lines_by_code_when_they_moved(tmp_path, capsys):
    before = make_report([400 * MiB, 600 * MiB], [(30, 300 * MiB, "out = model(x)"), (31, 100 * MiB, "loss.backward()")])
    after = make_report([200 * MiB, 300 * MiB], [(33, 150 * MiB, "out = model(x)"), (40, 10 * MiB, "scaler.step(opt)")])
    result = compare_reports(before, after)
    assert result["steps"] == [
        {"step": 1, "before": 400 * MiB, "after": 200 * MiB},
        {"step": 2, "before": 600 * MiB, "after": 300 * MiB},
    ]
    moved = result["lines"][0]
    assert (moved["before"], moved["after"], moved["before_line"], moved["after_line"]) == (300 * MiB, 150 * MiB, 30, 33)
    assert {(r["code"], r["before"], r["after"]) for r in result["lines"][1:]} == {
        ("loss.backward()", 100 * MiB, None), ("scaler.step(opt)", None, 10 * MiB)
    }

    before.write(tmp_path / "before.json")
    after.write(tmp_path / "after.json")
    assert main(["compare", str(tmp_path / "before.json"), str(tmp_path / "after.json")]) == 0
    out = capsys.readouterr().out
    assert "peak allocated: 600.00 MiB -> 300.00 MiB  -300.00 MiB (-50.0 %)" in out
    assert "  1     400.00 MiB  200.00 MiB  -200.00 MiB (-50.0 %)" in out
    rows = [" ".join(line.split()) for line in out.splitlines()]
    assert "/p/train.py:33 300.00 MiB 150.00 MiB -150.00 MiB (-50.0 %) out = model(x)" in rows
    assert "/p/train.py:31 100.00 MiB - left the top lines loss.backward()" in rows
    assert "/p/train.py:40 - 10.00 MiB new in the top lines scaler.step(opt)" in rows


def test_compare_refuses_a_non_report(tmp_path, capsys):
    (tmp_path / "a.json").write_text("{}")
    make_report([1], []).write(tmp_path / "b.json")
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    assert "no schema_version" in capsys.readouterr().err


def test_report_schema_versioning(tmp_path):
    report = make_report([5 * MiB], [(1, 5 * MiB, "x = 1")])
    data = report.to_dict()
    assert data["schema_version"] == SCHEMA_VERSION == 1
    data["a_field_from_the_future"] = True  # readers accept additions
    assert Report.from_dict(data).to_dict() == report.to_dict()
    data["schema_version"] = SCHEMA_VERSION + 1
    with pytest.raises(ReportError, match="newer"):
        Report.from_dict(data)
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ReportError):
        read_report(tmp_path / "broken.json")


def _frame(filename: str, line: int, name: str) -> dict:
    return {"filename": filename, "line": line, "name": name}


def snapshot_fixture() -> dict:
    """A memory snapshot in `_dump_snapshot`'s format: frames innermost first, C++ frames included."""
    lib = "/env/lib/python3.11/site-packages/torch/nn/modules/linear.py"
    user_forward = [_frame("??", 0, "c10::cuda::CUDACachingAllocator::malloc"), _frame(lib, 125, "forward"),
                    _frame("/p/model.py", 18, "forward"), _frame("/p/train.py", 40, "main")]
    user_grad = [_frame("/p/train.py", 41, "main")]
    trace = [
        {"action": "segment_alloc", "addr": 0, "size": 20 * MiB, "stream": 0, "frames": user_forward},
        {"action": "alloc", "addr": 0, "size": 8 * MiB, "stream": 0, "frames": user_forward},
        {"action": "alloc", "addr": 8 * MiB, "size": 4 * MiB, "stream": 0, "frames": user_grad},
        {"action": "free_requested", "addr": 0, "size": 8 * MiB, "stream": 0, "frames": user_forward},
        {"action": "free_completed", "addr": 0, "size": 8 * MiB, "stream": 0, "frames": user_forward},
        {"action": "alloc", "addr": 0, "size": 2 * MiB, "stream": 0, "frames": user_grad},
    ]
    segment = {
        "device": 0, "address": 0, "total_size": 20 * MiB, "stream": 0, "segment_type": "large",
        "blocks": [
            {"size": 2 * MiB, "requested_size": 2 * MiB, "address": 0, "state": "active_allocated"},
            {"size": 4 * MiB, "requested_size": 4 * MiB, "address": 8 * MiB, "state": "active_allocated"},
        ],
    }
    return {"segments": [segment], "device_traces": [trace]}


def test_import_memory_snapshot(tmp_path, capsys):
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(snapshot_fixture()))
    out = tmp_path / "out"
    assert main(["profile", "--import", str(path), "--out", str(out)]) == 0
    report = read_report(out / "report.json")
    assert (report.status, report.measured_with) == ("imported", "memory-snapshot")
    assert report.peak_allocated == 12 * MiB  # 8 MiB + 4 MiB, before the 8 MiB block was freed
    assert report.peak_reserved == 20 * MiB
    assert [(u.file, u.line, u.bytes) for u in report.top_lines] == [("/p/model.py", 18, 8 * MiB), ("/p/train.py", 41, 4 * MiB)]
    assert "peak allocated: 12.00 MiB" in capsys.readouterr().out


def test_import_refuses_pickles_with_objects(tmp_path):
    path = tmp_path / "evil.pickle"
    path.write_bytes(pickle.dumps(Path("/etc/passwd")))
    with pytest.raises(ImportFormatError, match="only plain data"):
        import_profile(path)


def test_import_refuses_nsight_systems(tmp_path, capsys):
    path = tmp_path / "report.sqlite"
    path.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    assert main(["profile", "--import", str(path), "--out", str(tmp_path)]) == 2
    assert "Nsight Systems exports are not supported" in capsys.readouterr().err


def test_import_chrome_trace_without_memory_events(tmp_path):
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1, "dur": 2}]}))
    with pytest.raises(ImportFormatError, match="profile_memory=True"):
        import_profile(path)


def test_import_chrome_trace_with_profiler_steps(tmp_path):
    """ProfilerStep spans (torch.profiler.schedule) become steps; memory live at a step's start counts."""

    def memory(ts: float, size: int, addr: int) -> dict:
        return {"ph": "i", "name": "[memory]", "ts": ts, "tid": 1,
                "args": {"Bytes": size, "Addr": addr, "Device Type": 1, "Device Id": 0, "Total Allocated": 0}}

    events = [
        {"ph": "X", "name": "ProfilerStep#7", "ts": 0, "dur": 100, "tid": 1},
        {"ph": "X", "name": "ProfilerStep#8", "ts": 100, "dur": 100, "tid": 1},
        {"ph": "X", "cat": "python_function", "name": "/p/train.py(30): train_step", "ts": 5, "dur": 180, "tid": 1},
        memory(10, 3 * MiB, 1), memory(20, 5 * MiB, 2), memory(30, -5 * MiB, 2),
        memory(150, 1 * MiB, 3),
    ]
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": events, "deviceProperties": [
        {"id": 0, "name": "NVIDIA H100", "totalGlobalMem": 85 * 1024**3}]}))
    report = import_profile(path)
    assert [s.peak_allocated for s in report.steps] == [8 * MiB, 4 * MiB]
    assert (report.device.type, report.device.name) == ("cuda", "NVIDIA H100")
    assert [(u.line, u.function, u.bytes) for u in report.top_lines] == [(30, "train_step", 8 * MiB)]
    assert "steps from ProfilerStep spans" in report.notes


def test_the_parent_side_imports_no_torch():
    modules = "oom_lsp.cli.profile, oom_lsp.profiling.runner, oom_lsp.profiling.importers"
    probe = f"import sys, {modules}; print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'pygls', 'lsprotocol')))"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
