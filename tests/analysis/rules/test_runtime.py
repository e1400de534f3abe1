"""OOM501 torch-load-without-map-location, OOM502 empty-cache-in-loop and
OOM503 zero-grad-keeps-grads, beyond their examples."""

from __future__ import annotations

import textwrap

import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.findings import Applicability, Finding


def _findings(source: str, code: str) -> list[Finding]:
    return analyze(textwrap.dedent(source), LintSettings(enabled=frozenset({code})))


def _fixed(source: str, code: str) -> str:
    return fix_source(textwrap.dedent(source), LintSettings(enabled=frozenset({code})), unsafe=True).source


# --- OOM501 ------------------------------------------------------------------

_CUDA = "import torch\nmodel = Net().cuda()\n"


@pytest.mark.parametrize(
    ("load", "fixed"),
    [
        (
            "model.load_state_dict(torch.load(path))",
            'model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))',
        ),
        (
            "sd = torch.load(path)\nmodel.load_state_dict(sd, strict=False)",
            'sd = torch.load(path, map_location="cpu", weights_only=True)\n'
            "model.load_state_dict(sd, strict=False)",
        ),
        (
            "model.load_state_dict(torch.load(path)['model'])",
            "model.load_state_dict(torch.load(path, map_location=\"cpu\")['model'])",
        ),
        (
            "sd = torch.load(path)\nprint(len(sd))\nmodel.load_state_dict(sd)",
            'sd = torch.load(path, map_location="cpu")\nprint(len(sd))\nmodel.load_state_dict(sd)',
        ),
        (
            "model.load_state_dict(torch.load(path, weights_only=False))",
            'model.load_state_dict(torch.load(path, weights_only=False, map_location="cpu"))',
        ),
        (
            "model.load_state_dict(torch.load(path, pickle_module=dill))",
            'model.load_state_dict(torch.load(path, pickle_module=dill, map_location="cpu"))',
        ),
        (
            "set_peft_model_state_dict(model, torch.load(path))",
            'set_peft_model_state_dict(model, torch.load(path, map_location="cpu", weights_only=True))',
        ),
        (
            "ckpt = torch.load(path)\nnew = {}\nfor k, v in ckpt.items():\n    new[k[7:]] = v\n"
            "optimizer.load_state_dict(new)",
            'ckpt = torch.load(path, map_location="cpu")\nnew = {}\n'
            "for k, v in ckpt.items():\n    new[k[7:]] = v\noptimizer.load_state_dict(new)",
        ),
    ],
    ids=[
        "direct",
        "through-a-name",
        "item",
        "read-elsewhere",
        "weights-only-kept",
        "pickle-module",
        "function-sink",
        "renamed-keys",
    ],
)
def test_state_loads_are_fixed(load: str, fixed: str) -> None:
    assert _fixed(_CUDA + load + "\n", "OOM501") == _CUDA + fixed + "\n"


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("import torch\nmodel = Net()\nmodel.load_state_dict(torch.load(path))\n", "no CUDA in the file"),
        (_CUDA + "scheduler.load_state_dict(torch.load(path))\n", "a scheduler's state is numbers"),
        (_CUDA + "self.lr_sched.load_state_dict(torch.load(path))\n", "a scheduler's state is numbers"),
        (_CUDA + "train_sampler.load_state_dict(torch.load(path))\n", "a sampler's state is on the CPU"),
        (_CUDA + "feats = torch.load(path)\nknn(feats)\n", "not a model's state"),
        (_CUDA + "def load(path):\n    return torch.load(path)\n", "where it goes is not known here"),
        (
            _CUDA
            + "torch.save(model.state_dict(), 'w.pt')\ntorch.save(x.cpu(), 'x.pt')\nx = torch.load('x.pt')\n",
            "the file saved that path from the CPU",
        ),
        (
            _CUDA
            + "model.to('cpu')\ntorch.save(model.state_dict(), p)\nmodel.load_state_dict(torch.load(q))\n",
            "every checkpoint of the file is saved from the CPU",
        ),
        (
            _CUDA + "torch.save({'w': model.state_dict(), 'n': n}, CKPT)\nstats = torch.load(STATS)\n",
            "the saved state went to another path",
        ),
        (
            _CUDA + "sd = torch.load(path)\ndef later():\n    model.load_state_dict(sd)\n",
            "a function defined later is not followed",
        ),
    ],
)
def test_torch_load_not_reported(source: str, why: str) -> None:
    assert _findings(source, "OOM501") == [], why


@pytest.mark.parametrize(
    "gpu",
    [
        "model.cuda()",
        "model.to('cuda:0')",
        "torch.cuda.set_device(rank)",
        "model.to(torch.accelerator.current_accelerator())",
    ],
)
def test_gpu_use_is_recognised(gpu: str) -> None:
    source = f"import torch\n{gpu}\nmodel.load_state_dict(torch.load(path))\n"
    assert [finding.line for finding in _findings(source, "OOM501")] == [3]


def test_a_model_moved_back_to_the_gpu_before_saving_is_reported() -> None:
    source = (
        _CUDA + "model.cpu()\nmodel.cuda()\ntorch.save(model.state_dict(), p)\n"
        "model.load_state_dict(torch.load(p))\n"
    )
    assert [finding.line for finding in _findings(source, "OOM501")] == [6]


def test_weights_only_fix_loads_the_same_state_dict(tmp_path) -> None:
    torch = pytest.importorskip("torch")
    path = tmp_path / "net.pt"
    source = (
        "import torch\n"
        "if torch.cuda.is_available():\n    torch.cuda.synchronize()\n"
        "net = torch.nn.Linear(3, 2)\n"
        f"net.load_state_dict(torch.load({str(path)!r}))\n"
    )
    fixed = _fixed(source, "OOM501")
    assert "weights_only=True" in fixed
    torch.save(torch.nn.Linear(3, 2).state_dict(), path)
    before: dict[str, object] = {}
    after: dict[str, object] = {}
    exec(compile(source, "<before>", "exec"), before)
    exec(compile(fixed, "<after>", "exec"), after)
    for name, value in before["net"].state_dict().items():
        assert torch.equal(value, after["net"].state_dict()[name])


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
