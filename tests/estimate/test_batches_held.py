"""Each batch a DataLoader yields is a tensor of its own: a loop that holds the next batch while it
runs the current one (Lightning's fetcher prefetches one; nanoGPT fetches the next batch mid-step)
holds two batches. The fake replay gave every iteration the same fake tensor, so the trace held
one: Lightning's autoencoder was 24 % under its real peak at batch 256, one batch of that."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from oom_lsp.estimate.estimator import EstimateOptions, run_harness

PREFETCHING = """
import torch
from torch.utils.data import DataLoader, TensorDataset

dataset = TensorDataset(torch.randn(1024, 4096), torch.randint(0, 10, (1024,)))
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4096, 16))
optimizer = torch.optim.Adam(model.parameters())
batches = iter(DataLoader(dataset, batch_size=256))
upcoming = next(batches)
for step in range(2):
    # The next batch fetched before this one runs (while the last one is still bound: three at once).
    batch, upcoming = upcoming, next(batches)
    model(batch[0]).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_a_prefetched_batch_is_held_beside_the_current_one(tmp_path):
    script = tmp_path / "prefetching.py"
    script.write_text(PREFETCHING)
    fake, real = run_harness(
        EstimateOptions(script=script, device="cpu", timeout=300),
        [{"mode": "fake"}, {"mode": "real", "profile_replay": True}],
    )
    assert fake["status"] == real["status"] == "stopped", fake["failure"]
    assert fake["peak_bytes"] == real["profile_replay_peak"]
