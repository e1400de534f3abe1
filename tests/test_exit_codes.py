"""docs/exit-codes.md's rows for an interpreter that is not there or has no torch, through
the installed console script: exit 2 and one line naming the interpreter, for every
command that runs the user's script."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests import console

SCRIPT = "import torch\nprint('never runs')\n"
COMMANDS = {
    "estimate": ["estimate", "train.py", "--device", "cpu"],
    "profile": ["profile", "train.py", "--device", "cpu"],
    "validate": ["validate", "train.py", "--before", "before.json", "--no-log"],
}
PREFIX = {"estimate": "oom-lsp estimate: ", "profile": "oom-lsp: ", "validate": "oom-lsp: "}


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(SCRIPT)
    before = {"script": str(tmp_path / "train.py"), "device": "cpu", "peak_bytes": 2**20, "gpu": None}
    (tmp_path / "before.json").write_text(json.dumps(before))
    return tmp_path


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_missing_interpreter_is_one_line_and_exit_2(project: Path, command: str):
    missing = project / "nope" / "python"
    done = console.run([*COMMANDS[command], "--python", str(missing)], project, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1] == f"{PREFIX[command]}cannot run {missing}: No such file or directory"
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("command", list(COMMANDS))
def test_an_interpreter_without_torch_is_one_line_and_exit_2(project: Path, command: str):
    no_torch = project / "python-without-torch"
    no_torch.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')  # no site-packages: no torch
    no_torch.chmod(0o755)
    done = console.run([*COMMANDS[command], "--python", str(no_torch)], project, timeout=120)
    assert done.returncode == 2, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if "torch" in line and ": running " not in line]
    assert line.startswith(f"{PREFIX[command]}{no_torch} ") and "install torch" in line, done.stderr
    assert "Traceback" not in done.stderr and "never runs" not in done.stdout + done.stderr
