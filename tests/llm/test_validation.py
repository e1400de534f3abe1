from __future__ import annotations

import json
import shutil
import sys
import threading
from pathlib import Path

import pytest

from oom_lsp.llm.validation import (
    MeasurementError,
    figures,
    measure_again,
    parse_measurement,
    read_measurement,
)
from oom_lsp.profiling.report import DeviceInfo, Report

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"


def test_read_both_kinds() -> None:
    profile = read_measurement(DATA / "cnn_report.json")
    estimate = read_measurement(DATA / "gpt_estimate.json")
    assert (profile.kind, profile.peak, profile.ran_out_of_memory) == ("profile", 7_190 * 2**20, True)
    assert (estimate.kind, estimate.peak, estimate.ran_out_of_memory) == ("estimate", 31_400 * 2**20, True)
    change = figures(profile, profile)
    assert change is not None and change.before == change.after


@pytest.mark.parametrize(
    ("content", "message"),
    [("{", "not JSON"), ('{"a": 1}', "neither a profile"), ('{"schema_version": 99}', "newer than")],
)
def test_unreadable(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(MeasurementError, match=message):
        read_measurement(path)


def test_profile_again_on_the_cpu(tmp_path: Path) -> None:
    script = tmp_path / "small_cnn.py"
    shutil.copy(ROOT / "fixtures" / "profiling" / "small_cnn.py", script)
    before = Report(
        script=str(script),
        status="completed",
        device=DeviceInfo("cpu"),
        steps_requested=1,
        peak_allocated=10**9,
    )
    after = measure_again(
        script,
        parse_measurement(before.to_dict(), "before"),
        python=sys.executable,
        timeout=120,
        out=tmp_path / "out",
    )
    assert (
        after.kind == "profile"
        and after.status == "completed"
        and after.source == str(tmp_path / "out" / "report.json")
    )
    assert after.peak is not None and 0 < after.peak < 10**9
    assert json.loads((tmp_path / "out" / "report.json").read_text())["steps_requested"] == 1


def test_cancelled_profile(tmp_path: Path) -> None:
    script = tmp_path / "small_cnn.py"
    shutil.copy(ROOT / "fixtures" / "profiling" / "small_cnn.py", script)
    before = Report(script=str(script), status="completed", device=DeviceInfo("cpu"), steps_requested=1)
    cancel = threading.Event()
    cancel.set()
    after = measure_again(
        script,
        parse_measurement(before.to_dict(), "before"),
        python=sys.executable,
        timeout=120,
        out=tmp_path / "out",
        cancel=cancel,
    )
    assert after.status == "cancelled" and after.peak is None and figures(after, after) is None
