"""OOM401 cat-in-loop, beyond its examples: when the fix must stay away, and
that a fix computes the same tensors."""

from __future__ import annotations

import textwrap

import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.findings import Finding


def _findings(source: str, code: str) -> list[Finding]:
    return analyze(textwrap.dedent(source), LintSettings(enabled=frozenset({code}), strict=True))


def _fixed(source: str, code: str) -> str:
    return fix_source(textwrap.dedent(source), LintSettings(enabled=frozenset({code}), strict=True), unsafe=True).source


_ACCUMULATE = """\
import torch
acc = torch.zeros(0, 3)
for y in loader:
    acc = torch.cat([acc, y], dim=DIM)
"""


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (_ACCUMULATE.replace("DIM", "axis"), "a dim that is a variable may change in the loop"),
        (_ACCUMULATE + "else:\n    print(acc)\n", "the loop's else clause reads the accumulator"),
        (
            "import torch\ntry:\n    acc = torch.zeros(0, 3)\n    for y in loader:\n"
            "        acc = torch.cat([acc, y])\nexcept KeyboardInterrupt:\n    print(acc)\n",
            "a handler may read the partial accumulator",
        ),
        (
            "import torch\ndef f(acc, loader):\n    for y in loader:\n"
            "        acc = torch.cat([acc, y])\n    return acc\n",
            "no assignment before the loop in its block",
        ),
        (
            _ACCUMULATE.replace("DIM", "0") + "def report():\n    print(acc.shape)\n",
            "a module-level function could read the global while the loop runs",
        ),
        (
            "import torch\nacc = torch.zeros(0)\nfor y in loader:\n    torch.mul(y, 2, out=y)\n"
            "    acc = torch.cat([acc, y])\n",
            "an out= write may change an appended tensor",
        ),
        (
            "import torch\nacc = torch.zeros(0)\nfor y in loader:\n    acc = torch.cat([acc, y])\n"
            "    y += 1\n",
            "an augmented assignment writes the appended tensor in place",
        ),
        (
            "import torch\nacc = torch.zeros(0)\nfor y in loader:\n    acc = torch.cat([acc, y, y])\n",
            "more than one piece per iteration",
        ),
        (
            "import torch\nacc = torch.zeros(0)\nfor y in loader:\n    if keep(y):\n"
            "        acc = torch.cat([acc, y])\n",
            "the append is not directly in the loop body",
        ),
    ],
)
def test_reported_without_fix(source: str, why: str) -> None:
    findings = _findings(source, "OOM401")
    assert len(findings) == 1, why
    assert findings[0].fix is None, why


def test_reported_on_the_assignment_line_with_the_function_as_spelled() -> None:
    [finding] = _findings(_ACCUMULATE.replace("DIM", "0"), "OOM401")
    assert finding.line == 4
    assert finding.message.startswith("acc is grown with cat inside a loop")


@pytest.mark.parametrize(
    "read",
    [
        "print(acc.shape)",
        "n = len(acc)",
        "if acc.size(0) > limit:\n        break",
        "log(acc.device, acc.ndim)",
    ],
)
def test_a_loop_that_reads_only_the_size_is_reported_without_fix(read: str) -> None:
    source = (
        f"import torch\nacc = torch.empty(0)\nfor y in loader:\n    acc = torch.cat([acc, y])\n    {read}\n"
    )
    [finding] = _findings(source, "OOM401")
    assert finding.fix is None


@pytest.mark.parametrize(
    "read",
    [
        "out = model(acc)",
        "window = acc[:, -block:]",
        "print(acc)",
        "stop = criteria(acc, scores)",
        "acc.add_(1)",
    ],
)
def test_a_loop_that_reads_the_values_is_not_reported(read: str) -> None:
    # Generation loops: each step reads the whole sequence anyway, and a list
    # of pieces would not give the loop what it reads.
    source = f"import torch\nfor batch in loader:\n    acc = torch.cat([acc, batch])\n    {read}\n"
    assert _findings(source, "OOM401") == []


@pytest.mark.parametrize(
    "loop",
    [
        "for batch in source:",
        "for i, batch in enumerate(source):",
        "for x_batch, y_batch in source:",
        "for y in val_loader:",
        "for y in testloader:",
        "for y in self.train_dataloader():",
        "for _, y in enumerate(tqdm(eval_dl)):",
        "for y in data_iter:",
        "for y in itertools.islice(dataset, 100):",
        "for (a, b), y in zip(pairs, loader):",
        "for y in range(0, len(x), args.batch_size):",
        "for y in range(num_batches):",
        "for y in range(len(train_loader)):",
        # A walk through a long input in strides, whatever the stride is called:
        # the pieces add up to the whole input (session 12; silent before).
        "for y in range(0, n, step):",
        "for y in range(start, length, chunk):",
    ],
)
def test_loops_over_data_are_recognised(loop: str) -> None:
    source = f"import torch\nacc = torch.empty(0)\n{loop}\n    acc = torch.cat([acc, y])\n"
    assert [finding.line for finding in _findings(source, "OOM401")] == [4]


@pytest.mark.parametrize(
    "loop",
    [
        "for y in ys:",
        "for y in range(steps):",
        "for batch_size in sizes:",
        "for y in groups:",
        "for y in x.chunk(4):",
        "while y is not None:",
        "for y in (a, b, c):",
        "for y in range(batch_size):",
        "for y in range(0, 64, 16):",
    ],
)
def test_other_loops_are_not_reported(loop: str) -> None:
    source = f"import torch\nacc = torch.empty(0)\n{loop}\n    acc = torch.cat([acc, y])\n"
    assert _findings(source, "OOM401") == []


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nfor acc in accs:\n    acc = torch.cat([acc, pad])\n",
        "import torch\nfor b in loader:\n    acc = f(b)\n    acc = torch.cat([acc, pad])\n    use(acc)\n",
        "import torch\nfor b in loader:\n    acc = torch.cat([acc, pad])\n    acc = f(b)\n",
    ],
    ids=["loop-target", "set-before", "set-after"],
)
def test_a_tensor_set_afresh_each_iteration_does_not_grow(source: str) -> None:
    assert _findings(source, "OOM401") == []


def test_one_line_loop_is_fixed() -> None:
    source = "import torch\nacc = torch.zeros(0)\nfor y in loader: acc = torch.cat([acc, y])\n"
    assert _fixed(source, "OOM401") == (
        "import torch\nacc = torch.zeros(0)\nacc_parts = [acc]\nfor y in loader: acc_parts.append(y)\n"
        "acc = torch.cat(acc_parts)\n"
    )


@pytest.mark.parametrize(
    ("start", "pieces", "function", "dim"),
    [
        ("torch.zeros(0, 3)", "[torch.randn(2, 3) for _ in range(4)]", "torch.cat", ", dim=0"),
        ("torch.randn(5, 1)", "[torch.randn(5, 2) for _ in range(3)]", "torch.cat", ", -1"),
        ("torch.empty(0)", "[torch.randn(3) for _ in range(3)]", "torch.cat", ""),
        ("torch.randn(1, 3)", "[torch.randn(3) for _ in range(3)]", "torch.vstack", ""),
        ("torch.randn(2, 1)", "[torch.randn(2, 2) for _ in range(3)]", "torch.hstack", ""),
        ("torch.randn(2, 2)", "[]", "torch.cat", ""),
    ],
)
def test_fixed_loop_computes_the_same_tensor(start: str, pieces: str, function: str, dim: str) -> None:
    torch = pytest.importorskip("torch")
    source = (
        f"import torch\ntorch.manual_seed(0)\nbatches = {pieces}\nacc = {start}\n"
        f"for piece in batches:\n    acc = {function}([acc, piece]{dim})\n"
    )
    fixed = _fixed(source, "OOM401")
    assert fixed != source
    before: dict[str, object] = {}
    after: dict[str, object] = {}
    exec(compile(source, "<before>", "exec"), before)
    exec(compile(fixed, "<after>", "exec"), after)
    assert torch.equal(before["acc"], after["acc"])


@pytest.mark.parametrize("count", [0, 1, 3])
@pytest.mark.parametrize("test", ["is None", "is not None"])
def test_fixed_first_piece_idiom_computes_the_same_value(count: int, test: str) -> None:
    torch = pytest.importorskip("torch")
    first, grow = "acc = piece", "acc = torch.cat([acc, piece], dim=1)"
    if test == "is not None":
        first, grow = grow, first
    source = (
        f"import torch\ntorch.manual_seed(0)\nbatches = [torch.randn(2, 3) for _ in range({count})]\n"
        f"acc = None\nfor piece in batches:\n    if acc {test}:\n        {first}\n    else:\n        {grow}\n"
    )
    fixed = _fixed(source, "OOM401")
    assert "acc_parts.append(piece)" in fixed
    before: dict[str, object] = {}
    after: dict[str, object] = {}
    exec(compile(source, "<before>", "exec"), before)
    exec(compile(fixed, "<after>", "exec"), after)
    if count == 0:
        assert before["acc"] is None and after["acc"] is None
    else:
        assert torch.equal(before["acc"], after["acc"])


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (
            "import torch\nacc = torch.empty(0)\nfor y in loader:\n    if acc is None:\n        acc = y\n"
            "    else:\n        acc = torch.cat([acc, y])\n",
            "the start is not None: after zero iterations the value would differ",
        ),
        (
            "import torch\nacc = None\nfor y in loader:\n    if acc is None:\n        acc = y.clone()\n"
            "    else:\n        acc = torch.cat([acc, y])\n",
            "the first piece is not the appended one",
        ),
        (
            "import torch\nacc = None\nfor y in loader:\n    if acc is None:\n        acc = y\n"
            "    elif keep:\n        acc = torch.cat([acc, y])\n",
            "an elif chain",
        ),
    ],
)
def test_first_piece_idiom_without_fix(source: str, why: str) -> None:
    [finding] = _findings(source, "OOM401")
    assert finding.fix is None, why
