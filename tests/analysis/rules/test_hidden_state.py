"""OOM305 hidden-state-carried-across-batches, beyond its examples."""

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
    ("constructor", "line"),
    [
        ("nn.GRU(4, 8)", "hidden = hidden.detach()"),
        ("nn.RNN(4, 8)", "hidden = hidden.detach()"),
        ("nn.LSTM(4, 8)", "hidden = tuple(h.detach() for h in hidden)"),
        (
            "build()",
            "hidden = tuple(h.detach() for h in hidden) if isinstance(hidden, tuple) else hidden.detach()",
        ),
    ],
)
def test_the_detach_fits_the_module(constructor: str, line: str) -> None:
    source = (
        f"import torch.nn as nn\nrnn = {constructor}\nhidden = init()\nfor x in loader:\n"
        "    out, hidden = rnn(x, hidden)\n    out.sum().backward()\n"
    )
    assert _lines(source, "OOM305") == [5]
    assert f"for x in loader:\n    {line}\n    out, hidden = rnn(x, hidden)" in _fixed(source, "OOM305")


def test_a_model_class_with_one_kind_of_recurrent_layer() -> None:
    source = """
        import torch.nn as nn
        class LM(nn.Module):
            def __init__(self):
                super().__init__()
                self.rnn = nn.GRU(4, 8)
        lm = LM()
        hidden = None
        for x in loader:
            out, hidden = lm(x, hidden)
            out.sum().backward()
    """
    assert "    if hidden is not None:\n        hidden = hidden.detach()\n    out, hidden" in _fixed(
        source, "OOM305"
    )


def test_a_state_defaulting_to_none_is_guarded() -> None:
    source = """
        import torch
        def fit(model, loader, state=None):
            for x in loader:
                out, state = model(x, state)
                out.sum().backward()
    """
    assert "        if state is not None:\n" in _fixed(source, "OOM305")


def test_a_one_line_loop_body_is_reported_without_a_fix() -> None:
    source = (
        "import torch\nhidden = init()\nwhile True: out, hidden = model(x, hidden); out.sum().backward()\n"
    )
    [finding] = _findings(source, "OOM305")
    assert finding.fix is None
    assert finding.message.startswith("Hidden state hidden is carried into the next batch")


@pytest.mark.parametrize(
    "source",
    [
        # The state is not fed back.
        "import torch\nfor x in loader:\n    out, hidden = model(x)\n    out.sum().backward()\n",
        "import torch\nfor x in loader:\n    out, hidden = model(x, other)\n    out.sum().backward()\n",
        # Detached in the loop, even conditionally.
        (
            "import torch\nfor x in loader:\n    if hidden is not None:\n        hidden = hidden.detach()\n"
            "    out, hidden = model(x, hidden)\n    out.sum().backward()\n"
        ),
        # A nested time-step loop inside a training loop.
        (
            "import torch\nfor x in loader:\n    h = None\n    for t in x:\n        out, h = model(t, h)\n"
            "    out.sum().backward()\n"
        ),
    ],
)
def test_hidden_state_not_reported(source: str) -> None:
    assert _findings(source, "OOM305") == []
