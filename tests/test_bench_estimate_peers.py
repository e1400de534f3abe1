"""bench/estimate_peers.py measures each peer as it claims: on a tiny MLP, the real CPU peak, our
estimate and MemTracker with a reset per step agree to a few scalars; MemTracker without the reset gives no
number (it refuses a module's second forward); accelerate's formula counts 4 x the parameters' bytes."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

TINY = """
import torch
from torch import nn
def build_model():
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10))
def batch(n):
    return torch.randn(n, 64), torch.randint(0, 10, (n,))
loss = nn.functional.cross_entropy
"""


def test_peers_are_measured_on_the_same_unchanged_script(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("estimate_peers", ROOT / "bench" / "estimate_peers.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    monkeypatch.setitem(bench.CASES, "tiny", (TINY, 32))
    row = bench.run_case("tiny", tmp_path, 300)
    assert row["real"] > 0
    # to the byte but for a few scalars (the loss, the step counts)
    assert abs(row["oom-lsp"]["bytes"] - row["real"]) <= 1024
    assert abs(row["MemTracker, reset per step"]["bytes"] - row["real"]) <= 1024
    assert "multiple iterative calls" in row["MemTracker"]["error"]
    parameters = (64 * 256 + 256 + 256 * 10 + 10) * 4
    if importlib.util.find_spec("accelerate") is not None:  # the bench extra; CI installs only the tests'
        assert row["accelerate"]["bytes"] == 4 * parameters
    else:
        assert "accelerate" in row["accelerate"]["error"]
    assert "bytes" in row["vram-check"] or "not installed" in row["vram-check"]["error"]
    assert bench.cell(row, "oom-lsp").endswith("0.0 %)")
