"""`oom-lsp profile` and `compare` through the installed console script."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import console

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]


def test_a_typo_in_the_script_arguments_measures_nothing(tmp_path):
    shutil.copy(ROOT / "fixtures" / "estimate" / "mlp.py", tmp_path)
    result = console.run(["profile", "mlp.py", "--device", "cpu", "--", "--nosuchflag"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines()[-1] == (
        "oom-lsp: no measurement: the script exited with code 2 before its first optimizer step"
    )
    assert "  | mlp.py: error: unrecognized arguments: --nosuchflag" in result.stdout.splitlines()


def test_the_output_shown_is_the_scripts_own(tmp_path):
    # Not the profiler's start/stop log lines, nor torch's warning that NumPy is not installed.
    shutil.copy(ROOT / "fixtures" / "profiling" / "crashes.py", tmp_path)
    result = console.run(["profile", "crashes.py", "--device", "cpu"], tmp_path)
    assert result.returncode == 1
    shown = [line for line in result.stdout.splitlines() if line.startswith("  | ")]
    assert shown[0] == "  | Traceback (most recent call last):"
    assert shown[-1] == "  | ValueError: corrupt shard 17"
    assert "USDT" not in result.stdout + result.stderr and "NumPy" not in result.stdout + result.stderr


CRASHING = 'raise ValueError("corrupt shard 17")\n'


def _profile(folder: Path, script: str, out: str, *args: str) -> Path:
    result = console.run(["profile", script, "--device", "cpu", "--steps", "2", "--out", out, *args], folder)
    assert (folder / out / "report.json").is_file(), result
    return folder / out / "report.json"


def test_compare_refuses_a_failed_run_and_another_script(tmp_path):
    shutil.copy(ROOT / "fixtures" / "profiling" / "small_cnn.py", tmp_path / "train.py")
    shutil.copy(ROOT / "fixtures" / "profiling" / "small_transformer.py", tmp_path / "other.py")
    before = _profile(tmp_path, "train.py", "before")
    other = _profile(tmp_path, "other.py", "other")
    (tmp_path / "train.py").write_text(CRASHING)
    crashed = _profile(tmp_path, "train.py", "after")

    result = console.run(["compare", str(before), str(crashed)], tmp_path)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.splitlines() == [
        f"oom-lsp: cannot compare {before} and {crashed}: the after run ended `error` after 0 optimizer steps: "
        "ValueError: corrupt shard 17",
        "oom-lsp: --force compares them anyway",
    ]
    result = console.run(["compare", str(before), str(other)], tmp_path)
    assert result.returncode == 2
    assert "the reports are of different scripts: " in result.stderr

    forced = console.run(["compare", "--force", str(before), str(crashed)], tmp_path)
    assert forced.returncode == 0 and forced.stdout.startswith("peak allocated: ")
    assert forced.stderr.startswith("warning: the after run ended `error` after 0 optimizer steps")


def test_compare_warns_when_the_arguments_differ(tmp_path):
    shutil.copy(ROOT / "fixtures" / "profiling" / "small_cnn.py", tmp_path / "train.py")
    before = _profile(tmp_path, "train.py", "before")
    after = _profile(tmp_path, "train.py", "after", "--", "--batch-size", "4")
    result = console.run(["compare", str(before), str(after)], tmp_path)
    assert result.returncode == 0
    assert result.stderr.splitlines() == [
        "warning: the script's arguments differ: (none) and --batch-size 4",
        "warning: batch size 8 before and 4 after",
    ]
