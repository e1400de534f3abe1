"""`oom-lsp validate` through the installed console script: the peak of an
unchanged script moves a little between CPU profiles (docs/profiling.md);
a fix that breaks the script is not validated by a smaller peak."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests import console

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def profiled(tmp_path: Path) -> Path:
    """train.py and the report of its profile, .oom_lsp/profile/report.json."""
    shutil.copy(ROOT / "fixtures" / "profiling" / "small_cnn.py", tmp_path / "train.py")
    result = console.run(["profile", "train.py", "--device", "cpu", "--steps", "2"], tmp_path)
    assert result.returncode == 0, result
    return tmp_path / ".oom_lsp" / "profile" / "report.json"


def test_an_unchanged_script_is_within_the_noise(profiled: Path):
    # The peak measured before is 100 KiB lower than this script's, as two CPU profiles of
    # the MLP fixture differed (by 64.5 KiB, up to 129 KiB over 11 runs).
    report = json.loads(profiled.read_text())
    report["peak_allocated"] -= 100 * 1024
    profiled.write_text(json.dumps(report))
    result = console.run(["validate", "train.py", "--before", str(profiled), "--no-log"], profiled.parents[2])
    assert result.returncode == 0, result
    (change,) = [line for line in result.stdout.splitlines() if line.startswith("change:")]
    assert change.endswith("(within the measurement noise of ±256.00 KiB: unchanged)"), change


def test_a_fix_that_breaks_the_script_is_not_validated(profiled: Path):
    folder = profiled.parents[2]
    (folder / "train.py").write_text('raise ValueError("corrupt shard 17")\n')
    result = console.run(["validate", "train.py", "--before", str(profiled), "--no-log"], folder)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == (
        "not validated: the after run ended `error` after 0 optimizer steps: ValueError: corrupt shard 17"
    )
    assert "  | ValueError: corrupt shard 17" in lines
    assert "peak after" not in result.stdout
