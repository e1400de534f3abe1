"""Whether a model's parameters are frozen where a forward call runs: a
frozen module called on data records no autograd graph."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.facts.contexts import call_graph
from oom_lsp.analysis.facts.frozen import frozen_at
from oom_lsp.analysis.settings import default_settings


def _frozen(source: str, model: str) -> bool:
    """Whether `model` is frozen at the last call of it (`model(...)`) in the snippet."""
    source = textwrap.dedent(source)
    context = FileContext(source=source, module=cst.parse_module(source), settings=default_settings(), path="m.py")
    program = call_graph(context).program
    calls = [
        call
        for scope in program.functions
        for call in scope.calls
        if call.node.func is not None and cst.Module([]).code_for_node(call.node.func) == model
    ]
    assert calls, f"no call of {model}"
    call = calls[-1]
    return frozen_at(call, model)


@pytest.mark.parametrize(
    ("source", "model", "expected"),
    [
        # The chain of module methods: eval, then requires_grad_(False).
        ("def f(m, x):\n    m.eval().requires_grad_(False).to('cuda')\n    return m(x)\n", "m", True),
        ("def f(m, x):\n    m.requires_grad_(requires_grad=False)\n    return m(x)\n", "m", True),
        # Freezing the model freezes what it contains.
        ("def f(m, x):\n    m.requires_grad_(False)\n    return m.encoder(x)\n", "m.encoder", True),
        # Freezing a submodule does not freeze the model.
        ("def f(m, x):\n    m.encoder.requires_grad_(False)\n    return m(x)\n", "m", False),
        # Unfrozen again before the call.
        ("def f(m, x):\n    m.requires_grad_(False)\n    m.requires_grad_()\n    return m(x)\n", "m", False),
        # After the call: decides nothing for it.
        ("def f(m, x):\n    y = m(x)\n    m.requires_grad_(False)\n    return y\n", "m", False),
        # Only on one path.
        ("def f(m, x, frozen):\n    if frozen:\n        m.requires_grad_(False)\n    return m(x)\n", "m", False),
        # Every parameter in a loop; some of them (under an if) is not all.
        ("def f(m, x):\n    for p in m.parameters():\n        p.requires_grad = False\n    return m(x)\n", "m", True),
        ("def f(m, x):\n    for n, p in m.named_parameters():\n        p.requires_grad_(False)\n    return m(x)\n", "m", True),
        (
            "def f(m, x):\n    for n, p in m.named_parameters():\n        if 'bias' in n:\n"
            "            p.requires_grad = False\n    return m(x)\n",
            "m",
            False,
        ),
        # Frozen where it was built.
        ("def f(make, x):\n    vgg = make().features.eval().requires_grad_(False)\n    return vgg(x)\n", "vgg", True),
        # A flag the analysis cannot read.
        ("def f(m, x, flag):\n    m.requires_grad_(flag)\n    return m(x)\n", "m", False),
        # An attribute frozen in __init__, called in another method.
        (
            "class S:\n    def __init__(self, net):\n        self.net = net\n        self.net.requires_grad_(False)\n"
            "    def run(self, x):\n        return self.net(x)\n",
            "self.net",
            True,
        ),
        # ... and unfrozen in a third: not frozen.
        (
            "class S:\n    def __init__(self, net):\n        self.net = net\n        self.net.requires_grad_(False)\n"
            "    def tune(self):\n        self.net.requires_grad_(True)\n"
            "    def run(self, x):\n        return self.net(x)\n",
            "self.net",
            False,
        ),
    ],
)
def test_frozen_at(source: str, model: str, expected: bool) -> None:
    assert _frozen(source, model) is expected
