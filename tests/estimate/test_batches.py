"""The batches the loader really yields (issue 16, cause 2): with per-batch padding each batch has
its own length, and the estimate traces each one (it used to replay the first batch for every
step), says which batch (step, micro-batch) made the peak, and states separately the worst case,
the longest batch the data can produce."""

from __future__ import annotations

import io
import json

import pytest

pytest.importorskip("torch")

from oom_lsp.estimate.estimator import EstimateOptions, estimate, run_harness

# Sentences padded per batch to their longest; ACCUMULATE micro-batches per optimizer step, as the
# Transformers Trainer does; the collate function returns a UserDict, as a tokenizer's BatchEncoding
# is (a leaf for torch's pytree).
PADDED = """
import collections, sys
import torch
from torch.utils.data import DataLoader, Dataset

LENGTHS = [int(length) for length in sys.argv[1].split(",")]
ACCUMULATE = int(sys.argv[2])


class Batch(collections.UserDict):
    pass


class Sentences(Dataset):
    def __len__(self):
        return len(LENGTHS)

    def __getitem__(self, index):
        return {"input_ids": [7] * LENGTHS[index]}


def pad(samples):
    longest = max(len(sample["input_ids"]) for sample in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.long)
    for row, sample in enumerate(samples):
        ids[row, : len(sample["input_ids"])] = torch.tensor(sample["input_ids"])
    return Batch(input_ids=ids, labels=ids.clone())


model = torch.nn.Sequential(torch.nn.Embedding(100, 64), torch.nn.Linear(64, 2048))
optimizer = torch.optim.AdamW(model.parameters())
for index, batch in enumerate(DataLoader(Sentences(), batch_size=2, collate_fn=pad), 1):
    logits = model(batch["input_ids"])
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten() % 2048)
    (loss / ACCUMULATE).backward()
    if index % ACCUMULATE == 0:
        optimizer.step()
        optimizer.zero_grad()
"""

# Step 1 gets short micro-batches, step 2's third micro-batch is the longest the steps see;
# the two longest sentences of the data (900) come after the second step.
LENGTHS = "30,20,10,10,40,20,10,10,10,10,300,280,20,20,10,10,900,900"


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("batches") / "padded.py"
    path.write_text(PADDED)
    return path


def _options(script, lengths=LENGTHS, accumulate=4):
    return EstimateOptions(script=script, script_args=[lengths, str(accumulate)], device="cpu", timeout=300)


def test_each_batch_is_traced_as_the_loader_gives_it(script):
    fake, real = run_harness(_options(script), [{"mode": "fake"}, {"mode": "real", "profile_replay": True}])
    assert fake["status"] == real["status"] == "stopped", fake["failure"]
    # The first batch (2 x 30) replayed for every micro-batch falls far short of step 2's 2 x 300.
    assert abs(fake["peak_bytes"] - real["profile_replay_peak"]) <= 0.001 * real["profile_replay_peak"]
    shapes = [batch["shapes"]["input_ids"] for batch in fake["traced_batches"]]
    assert shapes == [[2, 30], [2, 10], [2, 40], [2, 10], [2, 10], [2, 300], [2, 20], [2, 10]]


def test_the_peak_names_its_batch(script):
    prediction = estimate(_options(script)).to_json()
    batch = prediction["peak_batch"]
    assert (batch["step"], batch["micro_batch"], batch["index"]) == (2, 2, 6)
    assert batch["shapes"] == {"input_ids": [2, 300], "labels": [2, 300]}
    assert batch["loader"]["file"] == str(script) and batch["loader"]["line"] == 1 + PADDED.count(
        "\n", 0, PADDED.index("for index, batch")
    )
    assert prediction["batches_traced"] == 8


def test_the_worst_case_is_the_longest_batch_the_data_can_produce(script):
    prediction = estimate(_options(script)).to_json()
    worst = prediction["worst_case"]
    (longest,) = worst["batches"]
    assert longest["shapes"] == {"input_ids": [2, 900], "labels": [2, 900]}
    assert longest["samples"] == longest["scanned"] == 18
    # The same as a script whose every batch is that long.
    everywhere = estimate(_options(script, ",".join(["900"] * 18))).to_json()
    assert worst["peak_bytes"] == everywhere["peak_bytes"] > prediction["peak_bytes"]
    assert "worst_case" not in everywhere or everywhere["worst_case"] is None


def test_the_text_says_which_batch_and_the_worst_case(script):
    from oom_lsp.cli.estimate import write_text

    out = io.StringIO()
    write_text(estimate(_options(script)), out)
    text = out.getvalue()
    assert (
        "peak batch: step 2, micro-batch 2 (input_ids 2x300, labels 2x300), batch 6 of the DataLoader" in text
    )
    (line,) = [line for line in text.splitlines() if line.startswith("  worst case: ")]
    assert "with the longest batch the data can produce at every step: input_ids 2x900" in line
    assert "the 2 largest of 18 samples" in line
    json.dumps(estimate(_options(script)).to_json())  # the JSON output carries both
