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


TRAINING = """import torch

model = torch.nn.Linear(10, 10).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
total_loss = 0
for step in range(100):
    loss = model(torch.randn(8, 10).cuda()).sum()
    loss.backward()
    optimizer.step()
    total_loss += loss
"""


def _log(script: Path, line: int, code: str) -> str:
    return (
        "Traceback (most recent call last):\n"
        f'  File "{script}", line {line}, in <module>\n'
        f"    {code}\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 6.00 GiB total "
        "capacity; 5.00 GiB already allocated; 3.00 MiB free; 5.10 GiB reserved in total by PyTorch)\n"
    )


def test_explain_links_the_failing_line_to_its_rule_and_the_estimate(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAINING)
    (tmp_path / "train.log").write_text(_log(script, 10, "total_loss += loss"))
    result = console.run(["explain", "train.log"], tmp_path)
    assert result.returncode == 0
    advice = [line for line in result.stdout.splitlines() if line.startswith("  next: ")]
    assert advice[0].startswith("  next: OOM301 loss-accumulated-with-graph fires on that line: ")
    assert advice[0].endswith("`oom-lsp rule OOM301` explains it; `oom-lsp --check --fix train.py` applies its fix")
    assert advice[1] == (
        "  next: the largest batch that fits this GPU: `oom-lsp estimate train.py --gpu-memory 6GiB --find-max-batch`"
    )


def test_explain_on_a_line_no_rule_explains(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAINING)
    (tmp_path / "train.log").write_text(_log(script, 8, "loss.backward()"))
    result = console.run(["explain", "train.log"], tmp_path)
    advice = [line for line in result.stdout.splitlines() if line.startswith("  next: ")]
    assert advice[0].startswith("  next: no rule fires on that line; `oom-lsp --check train.py` lists the ")
