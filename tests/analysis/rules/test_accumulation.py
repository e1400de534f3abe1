"""OOM301 loss-accumulated-with-graph, beyond its examples."""

from __future__ import annotations

import textwrap

import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.findings import Applicability, Finding


def _findings(source: str, code: str, path: str = "train.py") -> list[Finding]:
    return analyze(textwrap.dedent(source), LintSettings(enabled=frozenset({code}), strict=True), path)


def _fixed(source: str, code: str) -> str:
    return fix_source(textwrap.dedent(source), LintSettings(enabled=frozenset({code}), strict=True), unsafe=True).source


def _lines(source: str, code: str, path: str = "train.py") -> list[int]:
    return [finding.line for finding in _findings(source, code, path)]


TRAIN_LOOP = """
import torch
import torch.nn.functional as F
def train(model, loader, opt):
    total = 0.0
    for x, y in loader:
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        total += loss
    {after}
"""


@pytest.mark.parametrize(
    ("after", "method"),
    [
        ('print(f"{total / len(loader):.3f}")', "item"),
        ("writer.add_scalar('loss', total, 0)", "item"),
        ("return total / len(loader)", "detach"),
        ("history.append(total)", "detach"),
        ("print(total.item())", "detach"),
        ("avg = total / len(loader)", "detach"),
    ],
)
def test_item_only_when_every_use_takes_a_float(after: str, method: str) -> None:
    source = TRAIN_LOOP.format(after=after)
    [finding] = _findings(source, "OOM301")
    assert finding.fix is not None and finding.fix.applicability is Applicability.SAFE
    assert f"total += loss.{method}()" in _fixed(source, "OOM301")
    assert finding.message == "total keeps every step's autograd graph: host memory grows each step"


def test_a_periodic_reset_does_not_end_the_accumulation() -> None:
    source = """
        import torch
        total_loss = 0.0
        for batch, (x, y) in enumerate(loader):
            loss = criterion(model(x), y)
            loss.backward()
            total_loss += loss
            if batch % 200 == 0:
                print(total_loss / 200)
                total_loss = 0
    """
    assert _lines(source, "OOM301") == [7]


@pytest.mark.parametrize(
    ("statement", "reported"),
    [
        ("total = total + loss", True),
        ("total = loss + total", True),
        ("total = total - loss", True),
        ("total = loss - total", False),
        ("total -= loss", True),
        ("total *= loss", False),
        ("stats['loss'] += loss", True),
        ("total = other + loss", False),
    ],
)
def test_accumulation_forms(statement: str, reported: bool) -> None:
    source = f"import torch\ntotal = 0\nstats = {{}}\nfor x, y in loader:\n    loss = criterion(model(x), y)\n    {statement}\n"
    assert bool(_findings(source, "OOM301")) is reported


def test_lightning_training_step_accumulates_across_batches() -> None:
    source = """
        import lightning as L
        import torch.nn.functional as F
        class Lit(L.LightningModule):
            def training_step(self, batch, batch_idx):
                loss = F.cross_entropy(self.model(batch["x"]), batch["y"])
                self.epoch_loss += loss
                local = 0
                local += loss
                return loss
    """
    assert _lines(source, "OOM301") == [7]


@pytest.mark.parametrize(
    "source",
    [
        # Under no_grad the sum records nothing.
        (
            "import torch\ntotal = 0\nfor x, y in loader:\n    loss = criterion(model(x), y)\n"
            "    with torch.no_grad():\n        total += loss\n"
        ),
        # A loss summed on purpose and backpropagated after the loop.
        "import torch\ntotal = 0\nfor x, y in chunks:\n    total += criterion(model(x), y)\ntotal.backward()\n",
        (
            "import torch\ntotal = 0\nfor x, y in chunks:\n    total = total + criterion(model(x), y)\n"
            "accelerator.backward(total / 4)\n"
        ),
        # The loop variable is not known to be a loss.
        "import torch\ntotal = 0\nfor loss in losses:\n    total += loss\n",
        # Accumulated inside a nested function defined in the loop: not this loop's business.
        (
            "import torch\ntotal = 0\nfor x, y in loader:\n    def step():\n        global total\n"
            "        total += criterion(model(x), y)\n"
        ),
    ],
)
def test_loss_accumulation_not_reported(source: str) -> None:
    assert _findings(source, "OOM301") == []
