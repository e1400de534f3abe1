"""OOM3xx false positives found on torch's own sources, and grad-mode corner cases."""

from __future__ import annotations

import textwrap

import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.findings import Finding


def _findings(source: str, code: str, path: str = "train.py") -> list[Finding]:
    return analyze(textwrap.dedent(source), LintSettings(enabled=frozenset({code}), strict=True), path)


def _fixed(source: str, code: str) -> str:
    return fix_source(textwrap.dedent(source), LintSettings(enabled=frozenset({code}), strict=True), unsafe=True).source


def _lines(source: str, code: str, path: str = "train.py") -> list[int]:
    return [finding.line for finding in _findings(source, code, path)]


@pytest.mark.parametrize(
    ("source", "code"),
    [
        # z3's `solver.model()` is no forward pass.
        ("import torch\ndef validate(solver):\n    return solver.model()\n", "OOM303"),
        # Rebinding forgets the eval mode: a frozen TorchScript warm-up.
        (
            "import torch\ndef compile_it(f, inps):\n    f = torch.jit.freeze(f.eval())\n    f(*inps)\n",
            "OOM303",
        ),
        # An unrolled forward pass keeps its outputs on purpose.
        (
            (
                "import torch\nimport torch.nn as nn\nclass Seq(nn.Module):\n    def forward(self, x, hidden=None):\n"
                "        result = []\n        for step in x:\n            hidden = self.cell(step, hidden)\n"
                "            result.append(hidden[0])\n        return torch.stack(result)\n"
            ),
            "OOM302",
        ),
        # What the function returns, through an assignment, is kept on purpose.
        (
            (
                "import torch\ndef heads(model, x):\n    outs = []\n    for head in range(3):\n"
                "        outs.append(model(x))\n    stacked = torch.stack(outs)\n    return stacked\n"
            ),
            "OOM302",
        ),
    ],
)
def test_torch_sources_false_positives(source: str, code: str) -> None:
    assert _findings(source, code) == []


def test_a_model_rebound_to_itself_keeps_its_mode() -> None:
    source = "import torch\ndef run(model, x):\n    model = model.eval().to('cuda')\n    return model(x)\n"
    assert _lines(source, "OOM303") == [4]


def test_eval_code_in_test_files_is_not_reported() -> None:
    source = "import torch\ndef check(model, x):\n    model.eval()\n    return model(x)\n"
    assert _lines(source, "OOM303", "train.py") == [4]
    assert _lines(source, "OOM303", "pkg/distributed_test.py") == []


@pytest.mark.parametrize(
    "context",
    ["torch.set_grad_enabled(train)", "torch.no_grad() if not train else contextlib.nullcontext()"],
)
def test_a_grad_mode_that_depends_on_a_value_is_not_judged(context: str) -> None:
    source = (
        "import torch\nimport contextlib\ndef evaluate_or_train(model, loader, train):\n    total = 0\n"
        f"    for x, y in loader:\n        with {context}:\n            loss = criterion(model(x), y)\n"
        "            total += loss\n"
    )
    for code in ("OOM301", "OOM303"):
        assert _findings(source, code) == []


def test_an_async_evaluation_function_is_fixed_inside_not_decorated() -> None:
    # On an `async def`, a decorator would only cover creating the coroutine, not running it.
    [finding] = _findings("import torch\nasync def predict(model, x):\n    model.eval()\n    return model(x)\n", "OOM303")
    assert finding.fix is not None and finding.fix.title == "Wrap in `with torch.inference_mode():`"
    # A statement that awaits is not wrapped: the grad mode would cover other coroutines.
    [awaiting] = _findings(
        "import torch\nasync def predict(model, x):\n    model.eval()\n    return model(await x)\n", "OOM303"
    )
    assert awaiting.fix is None


def test_an_evaluation_function_that_enables_grad_is_not_reported() -> None:
    assert (
        _findings(
            "import torch\n@torch.enable_grad()\ndef evaluate(model, x):\n    return model(x)\n", "OOM303"
        )
        == []
    )


def test_an_explicit_forward_call_is_a_forward_pass() -> None:
    source = "import torch\nimport torch.nn as nn\nclass Net(nn.Module):\n    def predict(self, x):\n        self.eval()\n        return self.forward(x)\n"
    assert _lines(source, "OOM303") == [6]


def test_a_model_wrapping_helper_is_not_an_evaluation_forward() -> None:
    # Seen on transformers' Trainer.evaluation_loop: `self._wrap_model(...)`
    # returns a model; it is not a forward pass.
    source = (
        "import torch\n"
        "class Trainer:\n"
        "    def evaluation_loop(self, loader):\n"
        "        model = self._wrap_model(self.model, training=False)\n"
        "        model.eval()\n"
        "        return model\n"
    )
    from oom_lsp.analysis import LintSettings, analyze

    assert [f.code for f in analyze(source, LintSettings(enabled=frozenset({"OOM303"}), strict=True))] == []


def test_set_grad_enabled_as_a_statement_turns_gradients_off_for_what_follows() -> None:
    # Seen in real validation loops: the statement form, not the `with` form.
    from oom_lsp.analysis import LintSettings, analyze

    source = (
        "import torch\n"
        "def validate(model, loader):\n"
        "    model.eval()\n"
        "    torch.set_grad_enabled(False)\n"
        "    total = 0.0\n"
        "    for x, y in loader:\n"
        "        out = model(x)\n"
        "        total += out.sum()\n"
        "    torch.set_grad_enabled(True)\n"
        "    return total\n"
    )
    enabled = frozenset({"OOM301", "OOM303"})
    assert analyze(source, LintSettings(enabled=enabled, strict=True)) == []
    # Turned back on before the forward: the evaluation forward is reported again.
    switched_back = source.replace(
        "    total = 0.0\n", "    torch.set_grad_enabled(True)\n    total = 0.0\n"
    )
    assert "OOM303" in [f.code for f in analyze(switched_back, LintSettings(enabled=enabled, strict=True))]
