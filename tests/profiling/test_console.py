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
