"""Seeding (issue 16, cause 3): the estimate of a script that draws its data at random must not
move from run to run, the fake run and a real run under the harness must draw the same batches,
and when the draw decides the peak, the estimate says by how much."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from oom_lsp.estimate.estimator import EstimateOptions, estimate, run_harness

# Sentences of very different lengths, in an order Python's `random` decides, padded per batch
# and shuffled by the DataLoader: the first batch's length, and so the peak, is the draw's.
SHUFFLED_SENTENCES = """
import json, random, sys
import torch
from torch.utils.data import DataLoader, Dataset

class Sentences(Dataset):
    def __init__(self):
        self.lengths = list(range(16, 16 + 64 * 24, 24))
        random.shuffle(self.lengths)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, index):
        return torch.ones(self.lengths[index], dtype=torch.long)

def pad(batch):
    ids = torch.zeros(len(batch), max(len(s) for s in batch), dtype=torch.long)
    for row, sentence in enumerate(batch):
        ids[row, : len(sentence)] = sentence
    return ids

model = torch.nn.Sequential(torch.nn.Embedding(100, 256), torch.nn.Linear(256, 512))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
lengths = []
for ids in DataLoader(Sentences(), batch_size=1, shuffle=True, collate_fn=pad):
    lengths.append(ids.shape[1])
    with open(sys.argv[1], "w") as handle:
        json.dump(lengths, handle)
    model(ids).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
"""


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("seeding") / "shuffled_sentences.py"
    path.write_text(SHUFFLED_SENTENCES)
    return path


def _options(script, seen):
    return EstimateOptions(script=script, script_args=[str(seen)], device="cpu", timeout=300)


def test_the_estimate_does_not_move_from_run_to_run(script, tmp_path):
    seen = tmp_path / "lengths.json"
    peaks, drawn = [], []
    for _ in range(2):  # each in a fresh interpreter, as two `oom-lsp estimate` commands
        (trace,) = run_harness(_options(script, seen), [{}])
        assert trace["status"] == "stopped", trace["failure"]
        peaks.append(trace["peak_bytes"])
        drawn.append(json.loads(seen.read_text()))
    assert peaks[0] == peaks[1] and drawn[0] == drawn[1]


def test_the_fake_run_draws_the_batches_a_real_run_under_the_harness_draws(script, tmp_path):
    # A real run draws its model's initial weights from torch's generator, a fake run does not:
    # the DataLoader's shuffle must not depend on how many numbers were drawn before it.
    fake_seen, real_seen = tmp_path / "fake.json", tmp_path / "real.json"
    fake, real = run_harness(
        _options(script, fake_seen), [{"mode": "fake"}, {"mode": "real", "args": [str(real_seen)]}]
    )
    assert fake["status"] == real["status"] == "stopped"
    # The first batch: the fake run replays it for every step (per-batch replay is another matter).
    assert json.loads(fake_seen.read_text())[0] == json.loads(real_seen.read_text())[0]


def test_when_the_draw_decides_the_peak_the_spread_is_reported(script, tmp_path):
    prediction = estimate(_options(script, tmp_path / "lengths.json")).to_json()
    spread = prediction["data_spread"]
    assert len(spread["peak_bytes"]) == 3 and spread["peak_bytes"][0] == prediction["peak_bytes"]
    assert min(spread["peak_bytes"]) < max(spread["peak_bytes"])
    (note,) = [note for note in prediction["corrections"] if note["name"] == "data-draw"]
    assert "3 draws" in note["detail"]


# A model initialised at random, then a shuffled loader without a generator of its own: its shuffle
# is drawn from torch's generator after the weights, as PEFT's LoRA example draws its batches.
DRAWN_AFTER_THE_WEIGHTS = """
import json, sys
from collections import UserDict
import torch
from torch.utils.data import DataLoader

class Encoding(UserDict):  # as Hugging Face's BatchEncoding, which tokenizer.pad returns
    def to(self, device):
        self.data = {key: value.to(device) for key, value in self.data.items()}
        return self

def pad(rows):
    ids = torch.zeros(len(rows), max(rows), dtype=torch.long)
    return Encoding({"input_ids": ids, "mask": torch.ones_like(ids)})

with torch.device("meta"):  # built without memory, as from_pretrained builds first: draws nothing
    torch.nn.Linear(4096, 4096)
model = torch.nn.Sequential(torch.nn.Embedding(100, 256), torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 16))
lengths = [16 + 24 * index for index in range(64)]
loader = DataLoader(lengths, batch_size=4, shuffle=True, collate_fn=pad)
optimizer = torch.optim.Adam(model.parameters())
seen = []
for batch in loader:
    batch = batch.to("cpu")
    seen.append(list(batch["input_ids"].shape))
    with open(sys.argv[1], "w") as handle:
        json.dump(seen, handle)
    model(batch["input_ids"]).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_the_fake_run_draws_the_batches_the_script_draws_when_run_by_python(tmp_path):
    # The truth of the zoo (bench/real_steps.py) and a user's run: torch's generator seeded 0, the
    # weights drawn, then the shuffle. A fake run draws the weights for real, so it shuffles alike.
    import subprocess
    import sys

    script = tmp_path / "drawn_after_the_weights.py"
    script.write_text(DRAWN_AFTER_THE_WEIGHTS)
    real_seen, fake_seen = tmp_path / "real.json", tmp_path / "fake.json"
    run_by_python = (
        f"import runpy, sys, torch; torch.manual_seed(0); sys.argv = [{str(script)!r}, {str(real_seen)!r}]; "
        f"runpy.run_path({str(script)!r}, run_name='__main__')"
    )
    subprocess.run([sys.executable, "-c", run_by_python], check=True, timeout=300)
    (fake,) = run_harness(
        EstimateOptions(script=script, script_args=[str(fake_seen)], device="cpu", timeout=300),
        [{"mode": "fake"}],
    )
    assert fake["status"] == "stopped", fake["failure"]
    assert json.loads(fake_seen.read_text())[0] == json.loads(real_seen.read_text())[0]


def test_a_batch_encoding_is_replayed_as_fake_tensors_and_its_draw_reported(tmp_path):
    # A UserDict batch was a pytree leaf: replayed as the same real tensors, counted nowhere,
    # and no spread reported although the draw decides the padded length.
    script = tmp_path / "drawn_after_the_weights.py"
    script.write_text(DRAWN_AFTER_THE_WEIGHTS)
    prediction = estimate(
        EstimateOptions(script=script, script_args=[str(tmp_path / "seen.json")], device="cpu", timeout=300)
    ).to_json()
    assert prediction["breakdown"]["inputs"] > 0
    # The Linear built on the meta device holds no memory (it was counted as 64 MiB of parameters).
    assert prediction["breakdown"]["parameters"] < 4096 * 4096 * 4
    spread = prediction["data_spread"]
    assert spread and len(spread["peak_bytes"]) == 3 and min(spread["peak_bytes"]) < max(spread["peak_bytes"])
