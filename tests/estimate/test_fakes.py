"""Deep copies of fake tensors (harness/fakes.py): torchmetrics' `add_state`, which Lightning's
`self.log` reaches, deep-copies its default `torch.tensor(0.0)` inside the training loop; the fake
run crashed there ("Attempted to set the storage of a tensor on device "meta" to a storage on
different device "cpu"")."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from oom_lsp.estimate.estimator import EstimateOptions, run_harness

DEEPCOPY_IN_THE_LOOP = """
import copy
import torch
model = torch.nn.Linear(64, 64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
states = []
for _ in range(2):
    states.append(copy.deepcopy(torch.tensor(0.0)))   # a metric's default state
    states.append(copy.deepcopy(torch.zeros(1000)))
    loss = model(torch.randn(8, 64)).sum()
    loss.backward()
    optimizer.step()
    assert float(states[0]) == 0.0
"""


def test_a_deep_copy_of_a_scalar_made_in_the_loop(tmp_path):
    script = tmp_path / "deepcopy_state.py"
    script.write_text(DEEPCOPY_IN_THE_LOOP)
    fake, real = run_harness(
        EstimateOptions(script=script, device="cpu", timeout=300),
        [{"mode": "fake"}, {"mode": "real", "profile_replay": True}],
    )
    assert fake["status"] == real["status"] == "stopped", fake["failure"]
    assert fake["peak_bytes"] == real["profile_replay_peak"]
