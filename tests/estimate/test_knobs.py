"""Batch-size knobs beyond argparse and DataLoader (issue 16, cause 5): a module global that a
configurator overrides (nanoGPT), `TrainingArguments(per_device_train_batch_size=...)`, a Lightning
`LightningDataModule`'s and `LightningModule`'s `batch_size` parameter. Each is found (the line the
editor decorates), reported as the batch size, and changed by `--batch-size` and by the doubling run
of `--find-max-batch`."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from oom_lsp.estimate.estimator import _NO_KNOB, EstimateError, EstimateOptions, estimate, run_harness

# nanoGPT's shape: defaults as module globals, then a configurator exec'd in the module's namespace
# that takes a config file and --key=value arguments and writes them with globals()[key] = value.
GLOBALS = """
import sys
import torch

batch_size = 12
block_size = 64
exec(open(CONFIGURATOR).read())
tokens = batch_size * block_size

model = torch.nn.Sequential(torch.nn.Embedding(256, 128), torch.nn.Linear(128, 256))
optimizer = torch.optim.AdamW(model.parameters())


def get_batch():
    return torch.randint(256, (batch_size, block_size))


for _ in range(2):
    x = get_batch()
    model(x).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
"""

CONFIGURATOR = """
from ast import literal_eval

for arg in sys.argv[1:]:
    if "=" not in arg:
        exec(open(arg).read())
    else:
        key, value = arg[2:].split("=")
        if key in globals():
            globals()[key] = literal_eval(value)
"""


@pytest.fixture(scope="module")
def nanogpt_like(tmp_path_factory):
    folder = tmp_path_factory.mktemp("globals")
    (folder / "configurator.py").write_text(CONFIGURATOR)
    (folder / "config.py").write_text("batch_size = 8\n")
    script = folder / "train.py"
    script.write_text(GLOBALS.replace("CONFIGURATOR", repr(str(folder / "configurator.py"))))
    return script


def _line(text: str, fragment: str) -> int:
    return 1 + text.count("\n", 0, text.index(fragment))


def _cpu(script, *args, batch_size=None):
    return EstimateOptions(
        script=script, script_args=list(args), device="cpu", timeout=300, batch_size=batch_size
    )


def test_a_module_global_overridden_by_a_configurator_is_the_knob(nanogpt_like):
    config = str(nanogpt_like.parent / "config.py")
    from_config, from_argument = run_harness(
        _cpu(nanogpt_like, config), [{}, {"args": [config, "--batch_size=4"]}]
    )
    assert from_config["batch_size"] == 8 and from_argument["batch_size"] == 4
    assert from_config["batch_knobs"] == [
        {"kind": "global batch_size", "file": str(nanogpt_like), "line": _line(GLOBALS, "batch_size = 12")}
    ]
    assert from_argument["peak_bytes"] < from_config["peak_bytes"]


def test_batch_size_changes_a_module_global(nanogpt_like):
    config = str(nanogpt_like.parent / "config.py")
    at_sixteen = estimate(_cpu(nanogpt_like, config, "--batch_size=4", batch_size=16)).to_json()
    assert at_sixteen["batch_size"] == 16
    # The same as the script run with 16 on its command line.
    (written,) = run_harness(_cpu(nanogpt_like, config, "--batch_size=16"), [{}])
    assert at_sixteen["peak_bytes"] == written["peak_bytes"]
    # --find-max-batch's second trace doubles the first's batch.
    _, doubled = run_harness(_cpu(nanogpt_like, config), [{}, {"batch_size": "double"}])
    assert doubled["batch_size"] == 16 and doubled["override_applied"]


TRAINING_ARGUMENTS = """
import torch
from transformers import TrainingArguments

args = TrainingArguments(
    output_dir="out",
    per_device_train_batch_size=3,
    use_cpu=True,
    report_to=[],
)
model = torch.nn.Linear(64, 512)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(args.per_device_train_batch_size, 64)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_training_arguments_per_device_train_batch_size_is_the_knob(tmp_path):
    transformers = pytest.importorskip("transformers")
    try:
        transformers.TrainingArguments  # noqa: B018 - transformers imports its modules lazily
    except ImportError as error:  # e.g. PyPI's torchvision next to the CPU torch, without the bench's .pth
        pytest.skip(f"transformers.TrainingArguments does not import here: {error}")
    script = tmp_path / "trainer_args.py"
    script.write_text(TRAINING_ARGUMENTS)
    plain = estimate(_cpu(script)).to_json()
    assert plain["batch_size"] == 3
    assert plain["batch_knobs"] == [
        {
            "kind": "TrainingArguments(per_device_train_batch_size=...)",
            "file": str(script),
            "line": _line(TRAINING_ARGUMENTS, "per_device_train_batch_size=3"),
        }
    ]
    larger = estimate(_cpu(script, batch_size=300)).to_json()
    assert larger["batch_size"] == 300
    assert larger["peak_bytes"] - plain["peak_bytes"] == 297 * (64 + 512) * 4


LIGHTNING = """
import lightning as L
import torch


class RandomData(L.LightningDataModule):
    def __init__(self, features: int, batch_size: int = 32):
        super().__init__()
        self.features, self.batch_size = features, batch_size


class Regressor(L.LightningModule):
    def __init__(self, hidden, batch_size=64):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(64, hidden)


data = RandomData(64, batch_size=BATCH)
model = Regressor(512)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model.layer(torch.randn(data.batch_size + model.hparams.batch_size, 64)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_lightning_datamodule_and_module_batch_size_are_knobs(tmp_path):
    pytest.importorskip("lightning")
    text = LIGHTNING.replace("BATCH", "16")
    script = tmp_path / "lightning_data.py"
    script.write_text(text)
    plain = estimate(_cpu(script)).to_json()
    assert {(knob["kind"], knob["line"]) for knob in plain["batch_knobs"]} == {
        ("LightningDataModule.__init__(batch_size=...)", _line(text, "data = RandomData")),
        (
            "LightningModule.__init__(batch_size=...)",
            _line(text, "def __init__(self, hidden, batch_size=64)"),
        ),
    }
    larger = estimate(_cpu(script, batch_size=400)).to_json()
    # Both knobs set to 400: 800 rows against 16 + 64.
    assert larger["peak_bytes"] - plain["peak_bytes"] == (800 - 80) * (64 + 512) * 4


def test_a_module_loop_variable_named_batch_is_no_knob(tmp_path):
    # `batch` counts as an argparse option's name, not as a module global's: it is a loop
    # variable as often as a size.
    script = tmp_path / "fixed.py"
    script.write_text(
        "import torch\nmodel = torch.nn.Linear(8, 8)\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for batch in range(2):\n    model(torch.randn(4, 8)).sum().backward()\n    optimizer.step()\n"
    )
    (trace,) = run_harness(_cpu(script), [{}])
    assert trace["status"] == "stopped" and trace["batch_knobs"] == [] and trace["batch_size"] is None
    with pytest.raises(EstimateError) as error:
        estimate(_cpu(script, batch_size=8))
    assert str(error.value) == _NO_KNOB
