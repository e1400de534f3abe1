"""Attributing memory to modules must not change what is alive (issue 16, cause 1).

torch.utils.module_tracker.ModuleTracker, which the harness used, keeps the graph of every forward
alive through the hooks it puts on it: a forward that is never backpropagated (a sanity check, a
probe each step, an auxiliary output the loss ignores) then held its saved tensors, in the trace
and in a real run under the tracker alike. Ground truth here is the script run by plain Python
under the profiler, with no harness at all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from oom_lsp.estimate.estimator import EstimateOptions, run_harness

# A forward with grad whose graph is dropped without backward, before training.
SANITY_FORWARD = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10))
x, y = torch.randn(256, 256), torch.randint(10, (256,))
print(model(x).shape)
optimizer = torch.optim.AdamW(model.parameters())
for _ in range(3):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
"""

# A probe forward every step, dropped (logging without no_grad).
PROBE_EACH_STEP = """
import torch
model = torch.nn.Sequential(torch.nn.Linear(256, 2048), torch.nn.ReLU(), torch.nn.Linear(2048, 10))
x, y = torch.randn(256, 256), torch.randint(10, (256,))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    probe = model(x[:128])
    del probe
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
"""

# A module with an auxiliary output whose graph the loss never reaches.
AUXILIARY_OUTPUT = """
import torch

class WithAuxiliary(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Linear(256, 1024)
        self.head = torch.nn.Linear(1024, 10)
        self.auxiliary = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.GELU())

    def forward(self, x):
        hidden = self.body(x)
        return self.head(hidden), self.auxiliary(hidden)

model = WithAuxiliary()
x, y = torch.randn(256, 256), torch.randint(10, (256,))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    logits, _ = model(x)
    torch.nn.functional.cross_entropy(logits, y).backward()
    optimizer.step()
    optimizer.zero_grad()
"""

SCRIPTS = {
    "sanity_forward": SANITY_FORWARD,
    "probe_each_step": PROBE_EACH_STEP,
    "auxiliary_output": AUXILIARY_OUTPUT,
}

PLAIN_RUN = """
import runpy, sys
import torch
from torch.profiler import ProfilerActivity, profile
from oom_lsp.estimate.harness.cpu_kernels import replay_allocations
torch.set_num_threads(1)
script = sys.argv[1]
sys.argv = sys.argv[1:]
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    runpy.run_path(script, run_name="__main__")
print("PEAK", replay_allocations(prof)[0])
"""


def _plain_peak(script: Path) -> int:
    """The script's peak under plain Python: no harness, no hooks, no shims."""
    done = subprocess.run(
        [sys.executable, "-c", PLAIN_RUN, str(script)],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("PEAK ")]
    return int(line.split()[1])


@pytest.fixture(scope="module")
def measured(tmp_path_factory):
    folder = tmp_path_factory.mktemp("attribution")
    runs, paths = [], {}
    for name, text in SCRIPTS.items():
        paths[name] = folder / f"{name}.py"
        paths[name].write_text(text)
        runs.append({"script": str(paths[name]), "mode": "fake"})
        runs.append({"script": str(paths[name]), "mode": "real", "profile_replay": True})
    options = EstimateOptions(script=paths["sanity_forward"], device="cpu", timeout=300)
    results = run_harness(options, runs)
    assert [result["status"] for result in results] == ["stopped"] * len(runs), [
        r["failure"] for r in results
    ]
    return {
        name: {"fake": results[2 * index], "real": results[2 * index + 1], "plain": _plain_peak(paths[name])}
        for index, name in enumerate(SCRIPTS)
    }


# Any TorchDispatchMode (the harness's tracker is one) gets a Python scalar argument (AdamW's
# `lr`, `x * 2.0`) as an 8-byte tensor while the op runs: a few such bytes are the mode's, not a
# graph kept alive.
WRAPPED_SCALARS = 64


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_a_real_run_under_the_harness_holds_what_a_plain_run_holds(measured, name):
    extra = measured[name]["real"]["profile_replay_peak"] - measured[name]["plain"]
    assert 0 <= extra <= WRAPPED_SCALARS


@pytest.mark.parametrize("name", list(SCRIPTS))
def test_the_estimate_of_a_dropped_graph_is_the_plain_runs_peak(measured, name):
    plain = measured[name]["plain"]
    assert abs(measured[name]["fake"]["peak_bytes"] - plain) <= 1e-5 * plain


def test_modules_are_still_named_in_forward_and_backward(measured):
    trace = measured["auxiliary_output"]["fake"]
    modules = dict(trace["top_modules"])
    assert {"WithAuxiliary.body", "WithAuxiliary.head"} <= set(modules)
    # The second step's peak is in backward or the optimizer step; its gradients were made by
    # the modules whose forward created the graph nodes that computed them.
    sanity = measured["sanity_forward"]["fake"]
    assert "Sequential.0" in dict(sanity["top_modules"]) and "Sequential.2" in dict(sanity["top_modules"])
