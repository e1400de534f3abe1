"""The traced step's memory timeline exported in PyTorch's memory-snapshot format
(`oom-lsp estimate --snapshot`), read back by PyTorch's own `torch.cuda._memory_viz`."""

from __future__ import annotations

import base64
import json
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oom_lsp.estimate.timeline import Alloc, Timeline, to_snapshot
from tests import console

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "estimate"


def _replayed_peak(snapshot: dict) -> int:
    """The active-memory peak the viewer draws: allocs add, completed frees subtract."""
    current = peak = 0
    for event in snapshot["device_traces"][0]:
        if event["action"] == "alloc":
            current += event["size"]
        elif event["action"] == "free_completed":
            current -= event["size"]
        peak = max(peak, current)
    return peak


def test_a_freed_block_s_address_is_reused_and_live_blocks_are_the_segments():
    timeline = Timeline(
        [
            [0, 1024, "parameters", "aten.empty", "outside the step", "train.py:3", "Linear"],
            [1, 4096, "activations", "aten.mm", "forward", "train.py:9", "Linear"],
            [1, -4096],
            [2, 4096, "gradients", "aten.mm", "backward", "train.py:10", "Linear"],
        ],
        workspace_bytes=512,
        peak_bytes=512 + 1024 + 4096,
    )
    snapshot = to_snapshot(timeline)
    allocs = [event for event in snapshot["device_traces"][0] if event["action"] == "alloc"]
    assert [event["size"] for event in allocs] == [512, 1024, 4096, 4096]
    assert allocs[2]["addr"] == allocs[3]["addr"]  # the freed 4 KiB block taken again
    assert allocs[2]["frames"] == [
        {"filename": "<aten>", "line": 0, "name": "aten.mm"},
        {"filename": "train.py", "line": 9, "name": "Linear"},
    ]
    assert [event["action"] for event in snapshot["device_traces"][0]].count("free_completed") == 1
    assert sorted(block["size"] for seg in snapshot["segments"] for block in seg["blocks"]) == [512, 1024, 4096]
    assert _replayed_peak(snapshot) == timeline.peak()[0] == 512 + 1024 + 4096
    assert isinstance(next(iter(timeline)), Alloc)  # the workspace, first


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_memory_viz_renders_the_export_and_its_peak_is_the_estimate_s(tmp_path, device):
    pytest.importorskip("torch")
    shutil.copy(FIXTURES / "mlp.py", tmp_path)
    result = console.run(
        ["estimate", "mlp.py", "--device", device, "--format", "json", "--snapshot", "step.pickle"], tmp_path
    )
    assert result.returncode == 0, result.stderr
    estimate = json.loads(result.stdout)
    assert "oom-lsp estimate: wrote step.pickle" in result.stderr
    # PyTorch's own tool renders it: the page embeds the pickle the web viewer then reads.
    viz = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "trace_plot", "step.pickle", "-o", "out.html"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert viz.returncode == 0, viz.stderr
    embedded = re.search(r'"base64": "([^"]+)"', (tmp_path / "out.html").read_text()).group(1)
    snapshot = pickle.loads(base64.b64decode(embedded))
    assert snapshot["device_traces"][0], "an empty trace"
    assert _replayed_peak(snapshot) == estimate["peak_bytes"]
    # ... and its text trace reads every event.
    text = subprocess.run(
        [sys.executable, "-m", "torch.cuda._memory_viz", "trace", "step.pickle"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert text.returncode == 0, text.stderr
    assert f"{len(snapshot['device_traces'][0])} entries" in text.stdout
