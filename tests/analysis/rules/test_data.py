"""OOM101 large-batch-size and OOM102 dataset-on-device, beyond their examples."""

from __future__ import annotations

import textwrap

import pytest

from oom_lsp.analysis import LintSettings, analyze, default_settings
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.registry import resolve_selection

OOM101 = LintSettings(enabled=frozenset({"OOM101"}), strict=True)
OOM102 = LintSettings(enabled=frozenset({"OOM102"}), strict=True)


def _lines(source: str, settings: LintSettings) -> list[int]:
    return [finding.line for finding in analyze(textwrap.dedent(source), settings)]


# --- OOM101 ------------------------------------------------------------------


def test_message_names_the_number_the_limit_and_where_it_goes() -> None:
    source = "from torch.utils.data import DataLoader\nloader = DataLoader(ds, batch_size=256)\n"
    (finding,) = analyze(source, OOM101)
    assert finding.message == "Batch size 256 is above the limit of 32 (the batch_size of DataLoader)"
    assert finding.fix is not None and not finding.fix.is_safe
    assert finding.fix.title == "Lower the batch size to 32"
    assert fix_source(source, OOM101, unsafe=False).source == source


def test_limit_comes_from_the_settings_and_is_inclusive() -> None:
    source = "import torch\nloader = torch.utils.data.DataLoader(ds, batch_size=64)\n"
    assert _lines(source, LintSettings(enabled=frozenset({"OOM101"}), max_batch_size=64, strict=True)) == []
    assert _lines(source, LintSettings(enabled=frozenset({"OOM101"}), max_batch_size=63, strict=True)) == [2]
    fixed = fix_source(source, LintSettings(enabled=frozenset({"OOM101"}), max_batch_size=48, strict=True), unsafe=True)
    assert fixed.source == "import torch\nloader = torch.utils.data.DataLoader(ds, batch_size=48)\n"


@pytest.mark.parametrize(
    "line",
    [
        "import torch.utils.data as tud\nloader = tud.DataLoader(ds, batch_size=0x100)",
        "from torch.utils.data.dataloader import DataLoader\nloader = DataLoader(ds, 128, True)",
        "from torch.utils.data import BatchSampler\ns = BatchSampler(sampler, batch_size=256, drop_last=True)",
        "import click\n@click.option('--batch-size', default=256)\ndef main(batch_size):\n    pass",
        "import argparse, torch\np.add_argument('--bs', default=64, type=int)",
        "import argparse\np.add_argument('--per_device_train_batch_size', default=64)",
        "from types import SimpleNamespace\ncfg = SimpleNamespace(lr=1e-3, batch_size=256)",
        "import torch\ncfg = dict(batch_size=256, lr=1e-3)",
        "import torch\nloader = torch.utils.data.DataLoader(ds, **{'batch_size': 256})",
        "from torch_geometric.loader import NeighborLoader\nl = NeighborLoader(g, num_neighbors=[10], batch_size=1024)",
        "import torch\nclass HParams:\n    BATCH_SIZE = 256",
        "from dataclasses import dataclass, field\n@dataclass\nclass Cfg:\n    batch_size: int = field(default=256)",
        "import torch\ncfg = {'model': {'width': 512}, 'train': {'micro_batch_size': 64}}",
    ],
)
def test_large_batch_settings_are_reported(line: str) -> None:
    findings = analyze(line + "\n", OOM101)
    assert len(findings) == 1, findings


@pytest.mark.parametrize(
    "line",
    [
        "import torch\nloader = torch.utils.data.DataLoader(ds, batch_size=32)",
        "import torch\nloader = torch.utils.data.DataLoader(ds, batch_size=2 ** 10)",
        "import torch\nloader = torch.utils.data.DataLoader(ds, batch_size=256 // accum)",
        "import torch\nloader = torch.utils.data.DataLoader(ds, *args)",
        "import torch\nloader = torch.utils.data.DataLoader(ds, num_workers=256)",
        "import torch\ncfg = {'global_batch_size': 1024, 'total_batch_size': 512, 'effective_batch_size': 512}",
        "import torch\nemb = model.encode(sentences, batch_size=256)",
        "import torch\nout = pipe(texts, batch_size=256)",
        "import argparse\np.add_argument('--num-samples', default=10000)",
        "import argparse\np.add_argument('--batch-size', default=args_default)",
        "import argparse\np.add_argument('--batch-size', **defaults)",
        "import torch\ndef make(batch_size=256):\n    return torch.utils.data.DataLoader(ds, batch_size=batch_size)",
        "import torch\nclass Net:\n    hidden_size = 4096",
        "from config import BATCH_SIZE\nimport torch\nloader = torch.utils.data.DataLoader(ds, batch_size=BATCH_SIZE)",
        "import torch\ncfg = {'train': {'batch_size': 16}, 'eval': {'batch_size': 512}}",
        "import torch\nclass EvalConfig:\n    batch_size: int = 512",
        "from transformers import TrainingArguments\na = TrainingArguments('o', per_device_train_batch_size=64, auto_find_batch_size=True)",
        "import torch\ntestloader = torch.utils.data.DataLoader(testset, batch_size=1000)",
        "from myproject import EvalArgs\nargs = EvalArgs(batch_size=512)",
    ],
)
def test_other_settings_are_silent(line: str) -> None:
    assert _lines(line + "\n", OOM101) == []


def test_constant_is_reported_once_on_its_literal_and_fixed_there() -> None:
    source = """\
    import torch
    def loaders():
        train = torch.utils.data.DataLoader(train_set, batch_size=BATCH, shuffle=True)
        extra = torch.utils.data.DataLoader(extra_set, batch_size=BATCH)
        return train, extra
    BATCH = 512  # tuned on an A100
    """
    findings = analyze(textwrap.dedent(source), OOM101)
    assert [(f.line, f.range.start.column) for f in findings] == [(6, 8)]
    assert "(BATCH, the batch_size of DataLoader)" in findings[0].message
    fixed = fix_source(textwrap.dedent(source), OOM101, unsafe=True).source
    assert fixed.splitlines()[5] == "BATCH = 32  # tuned on an A100"


def test_constants_are_scoped_by_function() -> None:
    source = """\
    import torch
    def evaluate(model, batch_size):
        return batch_size
    def main():
        batch_size = 128
        loader = torch.utils.data.DataLoader(train_set, batch_size=batch_size)
    def other(batch_size=16):
        return torch.utils.data.DataLoader(train_set, batch_size=batch_size)
    """
    assert _lines(source, OOM101) == [5]


def test_a_global_statement_makes_a_constant_variable() -> None:
    source = """\
    import torch
    BATCH = 256
    def shrink():
        global BATCH
        BATCH = 16
    loader = torch.utils.data.DataLoader(train_set, batch_size=BATCH)
    """
    assert _lines(source, OOM101) == []


def test_suppression_above_a_multiline_call() -> None:
    source = """\
    import torch
    # oom: ignore[large-batch-size]
    loader = torch.utils.data.DataLoader(
        train_set,
        batch_size=256,
    )
    """
    assert _lines(source, OOM101) == []


def test_class_field_suppressed_on_its_line() -> None:
    source = "import torch\nclass Config:\n    batch_size = 256  # noqa: OOM101\n"
    assert _lines(source, OOM101) == []


def test_deepspeed_global_batch_is_not_per_gpu() -> None:
    source = """\
    import torch
    ds_config = {
        "train_batch_size": 2048,
        "train_micro_batch_size_per_gpu": 64,
        "zero_optimization": {"stage": 2},
    }
    """
    assert _lines(source, OOM101) == [4]


def test_off_by_default_and_selectable() -> None:
    source = "import torch\nloader = torch.utils.data.DataLoader(train_set, batch_size=256)\n"
    assert _lines(source, default_settings()) == []
    assert _lines(source, LintSettings(enabled=resolve_selection(["OOM101"]), strict=True)) == [2]
    assert _lines(source, LintSettings(enabled=resolve_selection(["OOM1"]), strict=True)) == [2]


# --- OOM102 ------------------------------------------------------------------


def test_dataset_on_device_message_and_no_fix() -> None:
    source = "import torch\nX_train = X_train.cuda()\n"
    (finding,) = analyze(source, OOM102)
    assert finding.message == "The whole dataset X_train is moved to the GPU at once"
    assert finding.fix is None


@pytest.mark.parametrize(
    "code",
    [
        "train_x = torch.tensor(train_x).cuda()",
        "inputs = torch.from_numpy(pd.read_csv('train.csv').values).to(device)",
        "dataset.data = dataset.data.to('cuda')",
        "images = torch.stack([img for img, _ in train_set]).cuda()",
        "feats = torch.load('data/train_features.pt')\nfeats = feats.to(device)",
        "X = sklearn.datasets.load_digits().data\nX = torch.tensor(X).to(device)",
        "full = np.loadtxt('all.csv')\nX = full[:, :-1]\nX = torch.as_tensor(X).float().cuda()",
        "def main():\n    X_val = np.load('xv.npy')\n    X_val = torch.from_numpy(X_val).to(device)",
    ],
)
def test_whole_datasets_are_reported(code: str) -> None:
    header = (
        "import numpy as np\nimport pandas as pd\nimport sklearn.datasets\nimport torch\ndevice = 'cuda'\n"
    )
    source = header + code + "\n"
    assert len(analyze(source, OOM102)) == 1


@pytest.mark.parametrize(
    "code",
    [
        "model = model.to(device)",
        "state = torch.load('checkpoint_train.pt')\nstate = state.to(device)",
        "weights = torch.load('model_weights.pt').cuda()",
        "for batch in loader:\n    batch = batch.to(device)",
        "while True:\n    x = train_x.cuda()",
        "batch = [x.cuda() for x in X_train]",
        "X_train = X_train.to(torch.float32)",
        "X_train = X_train.to(dtype=torch.float16)",
        "data = data.to(device)",
        "inputs = torch.tensor([1, 2, 3]).cuda()",
        "def training_step(self, batch):\n    X_train = batch.cuda()",
        "graph = dataset[0].to(device)",
        "def get_batch(split):\n    data = train_data if split == 'train' else val_data\n    ix = torch.randint(len(data), (8,))\n    return data[ix].to(device)",
    ],
)
def test_batches_models_and_checkpoints_are_silent(code: str) -> None:
    source = "import numpy as np\nimport torch\ndevice = 'cuda'\n" + code + "\n"
    assert _lines(source, OOM102) == []


def test_dataset_moved_through_a_helper_variable_device() -> None:
    source = """\
    import torch
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    def main(args):
        train_dataset = build(args)
        train_dataset.tensors = tuple(t.to(device) for t in train_dataset.tensors)
        X_test = torch.tensor(X_test, device=args.device)
    """
    assert _lines(source, OOM102) == [6]


_FEATURE_BANK = """\
import torch
model = build().cuda()
model.eval()
EXTRA
train_features = torch.load("features/train.pth")
train_features = train_features.cuda()
"""


@pytest.mark.parametrize(
    ("extra", "reported"),
    [
        # An evaluation script: a k-NN over features of a frozen model.
        ("", False),
        ("@torch.no_grad()\ndef extract(loader):\n    return torch.cat([model(x) for x in loader])", False),
        # A script that also trains keeps gradients and activations next to it.
        ("model.train()\nloss = model(x).sum()\nloss.backward()", True),
        ("optimizer.step()", True),
    ],
)
def test_a_feature_bank_in_an_evaluation_script_is_its_working_set(extra: str, reported: bool) -> None:
    assert bool(_lines(_FEATURE_BANK.replace("EXTRA", extra), OOM102)) is reported


def test_a_file_that_neither_trains_nor_evaluates_is_still_checked() -> None:
    source = "import torch\ntrain_features = torch.load('features/train.pth')\ntrain_features = train_features.cuda()\n"
    assert _lines(source, OOM102) == [3]
