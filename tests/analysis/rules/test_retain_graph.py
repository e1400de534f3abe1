"""OOM304 retain-graph-in-loop, beyond its examples."""

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


@pytest.mark.parametrize(
    "call",
    [
        "loss.backward(None, True)",
        "torch.autograd.backward(loss, None, True)",
        "torch.autograd.backward([loss], retain_graph=True)",
        "scaler.scale(loss).backward(retain_graph=True)",
    ],
)
def test_retain_graph_spellings(call: str) -> None:
    source = f"import torch\nfor x in loader:\n    loss = model(x).sum()\n    {call}\n    opt.step()\n"
    [finding] = _findings(source, "OOM304")
    assert finding.line == 4
    assert finding.fix is not None and finding.fix.applicability is Applicability.UNSAFE


@pytest.mark.parametrize(
    "call",
    [
        "loss.backward(retain_graph=True, **options)",
        "loss.backward(retain_graph=True, create_graph=True)",
        "accelerator.backward(loss, None, True)",
        "loss.backward(gradient=None, retain_graph=False)",
    ],
)
def test_retain_graph_not_reported(call: str) -> None:
    source = f"import torch\nfor x in loader:\n    loss = model(x).sum()\n    {call}\n    opt.step()\n"
    assert _findings(source, "OOM304") == []


def test_a_second_backward_through_the_graph_gets_no_drop_fix() -> None:
    source = """
        import torch
        for x in loader:
            loss_a, loss_b = heads(model(x))
            loss_a.backward(retain_graph=True)
            log(loss_a)
            loss_b.backward()
            opt.step()
    """
    [finding] = _findings(source, "OOM304")
    assert finding.fix is None
    assert finding.message == "retain_graph=True keeps this graph's activations until the step's next backward"
