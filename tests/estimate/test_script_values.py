"""Values the script reads from fake tensors outside `.item()` (issue 16): `f"{loss:.4f}"`, which
crashed the fake run (nanoGPT, pytorch/examples' ImageNet), and `.tolist()`, which read one
element at a time."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from oom_lsp.estimate.estimator import EstimateOptions, run_harness

FORMATTED_LOSS = """
import torch
model = torch.nn.Linear(64, 64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
step = torch.tensor(7)
for i in range(3):
    loss = model(torch.randn(32, 64)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {i} loss {loss:.4f} {loss:>10} {step:d}")
"""

TOKEN_IDS = 20_000
TOLIST = """
import json, sys
import torch
torch.manual_seed(0)
ids = torch.randint(50000, (TOKEN_IDS,)).tolist()
grid = torch.arange(12).reshape(3, 4).tolist()
model = torch.nn.Linear(8, 3)
probabilities = model(torch.randn(5, 8)).softmax(-1).tolist()
with open(sys.argv[1], "w") as handle:
    json.dump({"sum": sum(ids), "count": len(ids), "grid": grid, "rows": [len(row) for row in probabilities]}, handle)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
""".replace("TOKEN_IDS", str(TOKEN_IDS))


@pytest.fixture(scope="module")
def traces(tmp_path_factory):
    folder = tmp_path_factory.mktemp("values")
    formatted, tolist = folder / "formatted_loss.py", folder / "tolist.py"
    formatted.write_text(FORMATTED_LOSS)
    tolist.write_text(TOLIST)
    runs = [
        {"script": str(formatted), "mode": "fake"},
        {"script": str(formatted), "mode": "real", "profile_replay": True},
        {"script": str(tolist), "mode": "fake", "args": [str(folder / "fake.json")]},
        {"script": str(tolist), "mode": "real", "args": [str(folder / "real.json")]},
    ]
    results = run_harness(EstimateOptions(script=formatted, device="cpu", timeout=300), runs)
    seen = {mode: json.loads((folder / f"{mode}.json").read_text()) for mode in ("fake", "real")}
    return results, seen


def test_a_formatted_fake_loss_prints_as_a_number(traces):
    (fake, real, *_), _ = traces
    assert fake["status"] == "stopped", fake["failure"]
    # The second optimizer step ends the run: the first step's line is the one printed.
    assert "step 0 loss 0.0000        0.0 7" in fake["output_tail"]
    assert fake["stubbed_scalars"] == 2  # the loss, read twice: a value only a real run knows
    # The real run under the harness's dispatch mode also holds a scalar argument as a tensor.
    assert 0 <= real["profile_replay_peak"] - fake["peak_bytes"] <= 64


def test_tolist_reads_a_real_twin_whole(traces):
    (*_, fake, real), seen = traces
    assert fake["status"] == real["status"] == "stopped"
    assert seen["fake"]["sum"] == seen["real"]["sum"] and seen["fake"]["count"] == TOKEN_IDS
    assert seen["fake"]["grid"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    # Element by element, tolist() read each value through the dispatcher (~70 us apiece).
    assert fake["value_reads"] < 100


def test_tolist_of_values_only_a_real_run_knows_gives_zeros_of_the_right_shape(traces):
    (*_, fake, _), seen = traces
    assert seen["fake"]["rows"] == seen["real"]["rows"] == [3] * 5
    assert fake["stubbed_scalars"] == 15


INFERENCE_MODE_ITEM = """
import torch
model = torch.nn.Linear(8, 4).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

@torch.inference_mode()
def accuracy(x):
    return (model(x).argmax(-1) == 0).sum().item()

for _ in range(3):
    x = torch.randn(16, 8).cuda()
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    accuracy(x)
"""


def test_item_under_inference_mode_is_read_like_any_item(tmp_path):
    """Under inference_mode `.item()` reaches the tracker as aten.item, not yet decomposed: it
    made the fake run fail (and the estimate fall back to real CPU steps) for every evaluation
    decorated as OOM303's fix writes it."""
    script = tmp_path / "evaluate.py"
    script.write_text(INFERENCE_MODE_ITEM)
    (trace,) = run_harness(EstimateOptions(script=script), [{}])
    assert trace["status"] == "stopped", trace["failure"]
    assert trace["value_reads"] == 1  # the evaluation after the first step
