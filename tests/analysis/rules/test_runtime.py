"""OOM502 empty-cache-in-loop and OOM503 zero-grad-keeps-grads, beyond their examples."""

from __future__ import annotations

import textwrap

import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.findings import Applicability, Finding


def _findings(source: str, code: str) -> list[Finding]:
    return analyze(textwrap.dedent(source), LintSettings(enabled=frozenset({code}), strict=True))


def _fixed(source: str, code: str) -> str:
    return fix_source(textwrap.dedent(source), LintSettings(enabled=frozenset({code}), strict=True), unsafe=True).source


# --- OOM502 ------------------------------------------------------------------


@pytest.mark.parametrize(
    "step",
    [
        "loss.backward()",
        "accelerator.backward(loss)",
        "scaler.scale(loss).backward()",
        "torch.autograd.backward([loss])",
        "optimizer.step()",
        "self.optim.step()",
        "scaler.step(opt)",
    ],
)
def test_training_steps_are_recognised(step: str) -> None:
    source = f"import torch\nwhile True:\n    {step}\n    torch.cuda.empty_cache()\n"
    assert [finding.line for finding in _findings(source, "OOM502")] == [4]


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (
            "import torch\nfor batch in loader:\n    scheduler.step()\n    torch.cuda.empty_cache()\n",
            "a scheduler step is not a training step",
        ),
        (
            "import torch\nfor batch in loader:\n    def closure():\n        loss.backward()\n"
            "    torch.cuda.empty_cache()\n",
            "backward inside a nested function does not run here",
        ),
        (
            "import torch\nfor batch in loader:\n    loss.backward()\n    def cleanup():\n"
            "        torch.cuda.empty_cache()\n",
            "a function defined in the loop is not called by it",
        ),
        (
            "import torch\nfor batch in loader:\n    loss.backward()\n    if i % 50 == 0:\n"
            "        log()\n    else:\n        torch.cuda.empty_cache()\n",
            "the else branch of a periodic test is periodic as well",
        ),
    ],
)
def test_not_reported(source: str, why: str) -> None:
    assert _findings(source, "OOM502") == [], why


def test_one_line_loop_is_reported_without_fix() -> None:
    source = "import torch\nfor b in loader: loss.backward(); torch.cuda.empty_cache()\n"
    [finding] = _findings(source, "OOM502")
    assert finding.fix is None


def test_removal_is_a_safe_fix() -> None:
    source = "import torch\nfor b in loader:\n    loss.backward()\n    torch.cuda.empty_cache()\n"
    [finding] = _findings(source, "OOM502")
    assert finding.fix is not None and finding.fix.applicability is Applicability.SAFE


# --- OOM503 ------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        "torch.zero_grad(False)",  # a module function, not a method of an optimizer or a model
        "optimizer.zero_grad(set_to_none=0)",  # not the literal False
        "optimizer.zero_grad(*args)",
        "optimizer.clear_grad(set_to_none=False)",
    ],
)
def test_zero_grad_not_reported(call: str) -> None:
    assert _findings(f"import torch\n{call}\n", "OOM503") == []


@pytest.mark.parametrize(
    "write",
    ["p.grad += g", "p.grad -= g", "p.grad.add_(g)", "p.grad.data.copy_(g)", "p.grad[idx] = g"],
)
def test_code_that_writes_into_grads_keeps_them(write: str) -> None:
    source = (
        f"import torch\nfor p, g in zip(params, grads):\n    {write}\n"
        "opt.step()\nopt.zero_grad(set_to_none=False)\n"
    )
    assert _findings(source, "OOM503") == []


@pytest.mark.parametrize(
    "write", ["p.grad.mul_(scale)", "p.grad /= scale", "p.grad = None", "norm = p.grad.norm()"]
)
def test_grads_scaled_or_read_are_no_reason_to_keep_them(write: str) -> None:
    source = f"import torch\nfor p in params:\n    {write}\nopt.zero_grad(set_to_none=False)\n"
    assert [finding.line for finding in _findings(source, "OOM503")] == [4]


def test_zero_grad_fix_is_unsafe() -> None:
    # None gradients make optimizers skip parameters they would have updated
    # with momentum or weight decay: the fix changes results in some programs.
    [finding] = _findings("import torch\nopt.zero_grad(set_to_none=False)\n", "OOM503")
    assert finding.fix is not None and finding.fix.applicability is Applicability.UNSAFE
