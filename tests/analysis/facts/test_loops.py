"""The iteration bound of a loop: the length of a collection the code lists,
through names and zip/enumerate; None for a loader, range(n),
a `while`, or a list that grows."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.facts.loops import iteration_bound, unrolls_a_recurrence
from oom_lsp.analysis.settings import default_settings


def _bound(source: str) -> int | None:
    """The bound of the last loop of the snippet (in the function `f` when there is one)."""
    source = textwrap.dedent(source)
    module = cst.parse_module(source)
    context = FileContext(source=source, module=module, settings=default_settings(), path="train.py")
    loops: list[tuple[cst.For, cst.FunctionDef | None]] = []

    class Finder(cst.CSTVisitor):
        def __init__(self) -> None:
            self.function: cst.FunctionDef | None = None

        def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
            self.function = node

        def visit_For(self, node: cst.For) -> None:
            loops.append((node, self.function))

    module.visit(Finder())
    loop, function = loops[-1]
    return iteration_bound(context, loop, function)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("for head in (a, b, c):\n    pass\n", 3),
        ("nets = [Net(), Net()]\nopts = [o1, o2]\nfor net, opt in zip(nets, opts):\n    pass\n", 2),
        ("nets = [Net(), Net()]\nfor i, net in enumerate(nets):\n    pass\n", 2),
        # zip stops at its shortest known argument.
        ("def f(loader):\n    for x, tag in zip(loader, ['a', 'b']):\n        pass\n", 2),
    ],
)
def test_a_listed_collection_bounds_the_loop(source: str, expected: int) -> None:
    assert _bound(source) == expected


@pytest.mark.parametrize(
    "source",
    [
        "def f(loader):\n    for x, y in loader:\n        pass\n",
        "def f(n):\n    for i in range(n):\n        pass\n",
        # range counts repetitions (steps, epochs), not listed items.
        "for step in range(3):\n    pass\n",
        # The list grows elsewhere: its length is not the literal's.
        "nets = [Net()]\nnets.append(Net())\nfor net in nets:\n    pass\n",
        "def f(loader):\n    for x in enumerate(loader):\n        pass\n",
        "items = [*others]\nfor item in items:\n    pass\n",
    ],
)
def test_an_unstated_length_is_unknown(source: str) -> None:
    assert _bound(source) is None


def _loop(source: str) -> cst.For:
    module = cst.parse_module(textwrap.dedent(source))
    found: list[cst.For] = []

    class Finder(cst.CSTVisitor):
        def visit_For(self, node: cst.For) -> None:
            found.append(node)

    module.visit(Finder())
    return found[0]


def test_a_decoder_unrolled_over_positions_is_one_forward_pass() -> None:
    assert unrolls_a_recurrence(
        _loop(
            """
            for di in range(target_length):
                out, hidden, _ = decoder(inp, hidden, encoder_outputs)
                loss += criterion(out, target[di])
                if inp.item() == EOS:
                    break
            """
        )
    )


@pytest.mark.parametrize(
    "source",
    [
        # A loader: each iteration is a batch, the state is carried across batches.
        "for x, y in loader:\n    out, hidden = model(x, hidden)\n    loss += crit(out, y)\n",
        # A backward pass per iteration: steps of training (truncated BPTT).
        "for t in range(steps):\n    out, h = rnn(x[t], h)\n    loss = crit(out, y[t])\n    loss.backward()\n",
        # Nothing carried from one iteration to the next.
        "for t in range(steps):\n    out = model(x[t])\n    loss += crit(out, y[t])\n",
    ],
)
def test_other_loops_are_not(source: str) -> None:
    assert not unrolls_a_recurrence(_loop(source))
