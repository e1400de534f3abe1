"""`oom-lsp estimate` through the installed console script, as a person runs
it: a typo in the script's arguments, a script that leaves early, data too
small for the batch, a crash; no verdict without two optimizer steps."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tests import console

pytest.importorskip("torch")

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "estimate"

LEAVES_EARLY = """
import sys
import torch
model = torch.nn.Linear(4, 4).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
model(torch.randn(2, 4, device="cuda")).sum().backward()
optimizer.step()
print("done after one step")
sys.exit(0)
"""

CRASHES_IN_A_HELPER = """
import torch

def load(path):
    return torch.load(path)  # the file does not exist

model = torch.nn.Linear(4, 4).cuda()
state = load("missing.pt")
"""


RUNNING = "oom-lsp estimate: running "  # the line a command that runs the user's code says first


def _after_running(stderr: str) -> list[str]:
    """stderr's lines after the one naming what runs (always first)."""
    lines = stderr.splitlines()
    assert lines and lines[0].startswith(RUNNING), stderr
    return lines[1:]


def test_a_typo_in_the_script_arguments_gives_no_verdict(tmp_path):
    shutil.copy(FIXTURES / "mlp.py", tmp_path)
    result = console.run(["estimate", "mlp.py", "--gpu", "RTX 3090", "--", "--nosuchflag"], tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""  # no verdict
    lines = _after_running(result.stderr)
    assert lines[0] == (
        "oom-lsp estimate: no estimate: the script exited with code 2 at mlp.py:22 before its first "
        "optimizer step; an estimate needs two"
    )
    assert "    | mlp.py: error: unrecognized arguments: --nosuchflag" in lines
    assert "Traceback" not in result.stderr and "NumPy" not in result.stderr


def test_a_script_that_leaves_after_one_step_gives_no_verdict(tmp_path):
    (tmp_path / "train.py").write_text(LEAVES_EARLY)
    result = console.run(["estimate", "train.py", "--gpu", "RTX 3090", "--format", "json"], tmp_path)
    assert result.returncode == 2
    error = json.loads(result.stdout)["error"]
    assert error.startswith("no estimate: the script ended after 1 optimizer step; an estimate needs two")
    assert "| done after one step" in error


def test_a_batch_larger_than_the_data_gives_no_verdict(tmp_path):
    shutil.copy(FIXTURES / "cnn.py", tmp_path)
    result = console.run(["estimate", "cnn.py", "--gpu", "RTX 3090", "--batch-size", "300"], tmp_path)
    assert result.returncode == 2
    assert _after_running(result.stderr)[:2] == [
        "oom-lsp estimate: no estimate: the script ended before its first optimizer step; an estimate needs two",
        "  DataLoader at cnn.py:38 gives 0 batches: 256 samples in batches of 300, drop_last=True",
    ]


def test_a_crash_shows_the_scripts_own_frames(tmp_path):
    (tmp_path / "train.py").write_text(CRASHES_IN_A_HELPER)
    result = console.run(["estimate", "train.py"], tmp_path)
    assert result.returncode == 2
    lines = _after_running(result.stderr)
    assert lines[0].startswith("oom-lsp estimate: the script crashed at train.py:5: FileNotFoundError: ")
    # the library line that raised, then the script's own frames
    assert lines[1].startswith("  raised in torch/serialization.py:") and lines[1].endswith(", in __init__")
    assert lines[2:] == [
        "  the script's frames, innermost last:",
        "    train.py:8, in <module>",
        '      state = load("missing.pt")',
        "    train.py:5, in load",
        "      return torch.load(path)  # the file does not exist",
    ]


def test_the_largest_batch_is_bound_by_the_data_when_it_runs_out(tmp_path):
    # 256 samples with drop_last=True: above batch 128 there are fewer than two steps.
    shutil.copy(FIXTURES / "cnn.py", tmp_path)
    result = console.run(["estimate", "cnn.py", "--gpu", "RTX 3090", "--find-max-batch"], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert any(line.startswith("largest batch that fits: 128 (checked by a fake run: ") for line in lines)
    assert "bound by the data: at batch 256 the script does not reach two optimizer steps" in lines
    (why,) = [line for line in lines if line.startswith("why not the line's answer: ")]
    assert "(DataLoader at cnn.py:38 gives 1 batch: 256 samples in batches of 256, drop_last=True)" in why


def test_the_largest_batch_keeps_the_margin_and_says_why_the_line_was_off(tmp_path):
    shutil.copy(FIXTURES / "mlp.py", tmp_path)
    # A card small enough that the answer is under the search's limit (8,192).
    result = console.run(["estimate", "mlp.py", "--gpu-memory", "800MiB", "--find-max-batch"], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = [line.strip() for line in result.stdout.splitlines()]
    assert "keeps reserved memory + CUDA context within 90% of 800.00 MiB (720.00 MiB, a 10% margin)" in lines
    (why,) = [line for line in lines if line.startswith("why not the line's answer: ")]
    assert "the peak moves from the optimizer step (at batch 64) to the " in why


def test_progress_on_a_terminal_and_none_in_a_pipe(tmp_path):
    shutil.copy(FIXTURES / "mlp.py", tmp_path)
    code, out, screen = console.run_on_a_terminal(["estimate", "mlp.py", "--gpu", "RTX 3090"], tmp_path)
    assert code == 0 and out.startswith("mlp.py: batch size 64")
    states = [line.replace("\x1b[K", "") for line in screen.split("\r") if line.startswith("estimating")]
    assert states[0].startswith("estimating mlp.py: starting Python and importing torch · 0/2 optimizer steps · ")
    assert any(s.startswith("estimating mlp.py: trace 1 · running the script · 0/2 optimizer steps") for s in states)
    assert any(s.startswith("estimating mlp.py: trace 1 · tracing · 1/2 optimizer steps") for s in states)
    assert any(s.startswith("estimating mlp.py: trace 1 · reading the trace · 2/2 optimizer steps") for s in states)
    piped = console.run(["estimate", "mlp.py", "--gpu", "RTX 3090"], tmp_path)
    # In a pipe: only the line naming what runs, no progress.
    assert piped.returncode == 0 and _after_running(piped.stderr) == []


def test_a_hanging_script_shows_the_time_going_by(tmp_path):
    # 12 s: `import torch` may take half of it on a loaded machine before the line starts.
    shutil.copy(FIXTURES / "hangs.py", tmp_path)
    code, _, screen = console.run_on_a_terminal(["estimate", "hangs.py", "--timeout", "12"], tmp_path)
    assert code == 2
    states = [line.replace("\x1b[K", "") for line in screen.split("\r") if line.startswith("estimating hangs.py: trace 1")]
    seconds = [float(state.rsplit(" · ", 1)[1].removesuffix(" s")) for state in states]
    assert seconds == sorted(seconds) and seconds[-1] - seconds[0] >= 3, states
    assert "did not reach its second optimizer step within 12 s" in screen


def test_find_max_batch_on_a_small_model_stops_at_its_documented_bound(tmp_path: Path) -> None:
    """On 80 GiB a small MLP's memory line answers hundreds of millions: the search checks no
    batch above MAX_SEARCHED_BATCH, says so in one line before, and names the bound."""
    from oom_lsp.estimate.search import MAX_SEARCHED_BATCH

    shutil.copy(FIXTURES.parent / "budget" / "train_mlp.py", tmp_path / "train.py")
    done = console.run(["estimate", "train.py", "--gpu-memory", "80GiB", "--find-max-batch"], tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        done.stderr.splitlines()[0],  # oom-lsp estimate: running train.py with ...
        f"oom-lsp estimate: searching for the largest batch that fits, up to {MAX_SEARCHED_BATCH:,} "
        "(at most 8 fake runs)",
    ]
    assert done.stderr.startswith("oom-lsp estimate: running train.py with ")
    assert f"largest batch that fits: {MAX_SEARCHED_BATCH:,} (checked by a fake run" in done.stdout
    assert f"bound by the search, which stops at {MAX_SEARCHED_BATCH:,}: the memory line alone gives " in done.stdout
    result = json.loads(
        console.run(
            ["estimate", "train.py", "--gpu-memory", "80GiB", "--find-max-batch", "--format", "json"],
            tmp_path,
            timeout=600,
        ).stdout
    )["max_batch"]
    assert (result["max_batch"], result["bound"], result["search_limit"]) == (
        MAX_SEARCHED_BATCH,
        "search limit",
        MAX_SEARCHED_BATCH,
    )
    assert result["checks"] == 1 and result["line_max_batch"] > MAX_SEARCHED_BATCH
