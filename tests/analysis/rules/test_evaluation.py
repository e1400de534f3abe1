"""OOM303 eval-without-no-grad, beyond its examples."""

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
    ("imports", "decorator", "added_import"),
    [
        ("import torch", "@torch.inference_mode()", False),
        ("import torch as T", "@T.inference_mode()", False),
        ("from torch import inference_mode, nn", "@inference_mode()", False),
        ("import torch.nn as nn", "@torch.inference_mode()", True),
    ],
)
def test_the_decorator_respects_the_files_imports(imports: str, decorator: str, added_import: bool) -> None:
    source = f"{imports}\n\ndef predict(model, x):\n    model.eval()\n    return model(x)\n"
    [finding] = _findings(source, "OOM303")
    assert finding.line == 5 and finding.fix is not None and finding.fix.applicability is Applicability.SAFE
    fixed = _fixed(source, "OOM303")
    assert f"{decorator}\ndef predict(model, x):" in fixed
    assert ("\nimport torch\n" in fixed) is added_import


def test_the_mnist_test_function_is_evaluation_code() -> None:
    source = """
        import torch
        import torch.nn.functional as F
        def test(model, device, test_loader):
            model.eval()
            test_loss = 0
            for data, target in test_loader:
                output = model(data.to(device))
                test_loss += F.nll_loss(output, target.to(device), reduction="sum").item()
            return test_loss
    """
    assert _lines(source, "OOM303") == [8]
    assert "@torch.inference_mode()\ndef test(model, device, test_loader):" in _fixed(source, "OOM303")


@pytest.mark.parametrize(
    ("source", "path"),
    [
        (
            "import torch\ndef test_forward(model):\n    assert model(x).shape == (1,)\n",
            "tests/test_model.py",
        ),
        ("import torch\ndef test_forward(model):\n    assert model(x).shape == (1,)\n", "model_test.py"),
        (
            (
                "import torch\nimport unittest\nclass TestNet(unittest.TestCase):\n    def test_forward(self, model=None):\n"
                "        model(x)\n"
            ),
            "checks.py",
        ),
        (
            "import torch\ndef evaluate(model, x):\n    return [f(x) for f in (lambda t: model(t),)]\n",
            "train.py",
        ),
        ("import torch\ndef evaluate(model, x):\n    return model.generate(x)\n", "train.py"),
        ("import torch\ndef eval_step(model, x):\n    return model(x)\n", "train.py"),
        (
            "import torch\ndef run(model, x):\n    model.eval()\n    return criterion(model.logits, x)\n",
            "train.py",
        ),
        # eval() in one function does not carry into another.
        (
            "import torch\ndef a(model):\n    model.eval()\ndef b(model, x):\n    return model(x)\n",
            "train.py",
        ),
        (
            "import torch\ndef run(model, x):\n    model.eval()\n    model.train(True)\n    return model(x)\n",
            "train.py",
        ),
        (
            "import torch\ndef run(model, x, mode):\n    model.eval()\n    model.train(mode)\n    return model(x)\n",
            "train.py",
        ),
    ],
)
def test_eval_not_reported(source: str, path: str) -> None:
    assert _findings(source, "OOM303", path) == []


def test_train_false_is_eval_mode() -> None:
    source = "import torch\ndef run(net, x):\n    net.train(False)\n    return net(x)\n"
    assert _lines(source, "OOM303") == [4]


def test_a_loop_that_switches_modes_is_not_wrapped() -> None:
    source = """
        import torch
        for epoch in range(3):
            model.train()
            model.eval()
            out = model(x)  # check
    """
    assert _fixed(source, "OOM303") == textwrap.dedent(
        """
        import torch
        for epoch in range(3):
            model.train()
            model.eval()
            with torch.inference_mode():
                out = model(x)  # check
        """
    )


def test_a_wrapped_loop_keeps_its_multiline_strings_and_comments() -> None:
    source = '''
        import torch
        def main(model, loader):
            train(model)
            model.eval()
            for x in loader:
                out = model(x)
                report = """
        a table
        """
                # trailing comment of the block
            done()
    '''
    assert _fixed(source, "OOM303") == textwrap.dedent(
        '''
        import torch
        def main(model, loader):
            train(model)
            model.eval()
            with torch.inference_mode():
                for x in loader:
                    out = model(x)
                    report = """
        a table
        """
                # trailing comment of the block
            done()
        '''
    )
