"""OOM302 tensor-kept-across-iterations, beyond its examples."""

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
    ("stored", "fixed"),
    [
        ("out", "out.detach()"),
        ("out.cpu()", "out.detach().cpu()"),
        ("out.to('cpu')", "out.detach().to('cpu')"),
        ("out.float().cpu()", "out.float().detach().cpu()"),
        ("out * 2", "(out * 2).detach()"),
        ("(out + 1)", "((out + 1).detach())"),
        ("[out, y]", "[out.detach(), y]"),
        ("(out.cpu(), loss)", "(out.detach().cpu(), loss.detach())"),
        ("{'out': out, 'n': 1}", "{'out': out.detach(), 'n': 1}"),
    ],
)
def test_detach_is_inserted_where_the_graph_is(stored: str, fixed: str) -> None:
    source = (
        "import torch\nkept = []\nfor x, y in loader:\n    out = model(x)\n    loss = criterion(out, y)\n"
        f"    kept.append({stored})\n"
    )
    [finding] = _findings(source, "OOM302")
    assert finding.line == 6 and finding.fix is not None
    assert f"    kept.append({fixed})\n" in _fixed(source, "OOM302")


@pytest.mark.parametrize(
    ("binding", "reported"),
    [
        ("kept = []", True),
        ("kept = list()", True),
        ("kept = collections.deque(maxlen=100)", True),
        ("kept = defaultdict(list)", True),
        ("kept = {}", True),
        ("kept = make_buffer()", False),
        ("kept = []\nkept = make_buffer()", False),
    ],
)
def test_only_lists_and_dicts_are_containers(binding: str, reported: bool) -> None:
    source = f"import torch\nimport collections\n{binding}\nfor x in loader:\n    kept.append(model(x))\n"
    assert bool(_findings(source, "OOM302")) is reported


def test_a_container_reset_inside_an_if_still_outlives_iterations() -> None:
    source = (
        "import torch\nbuffer = []\nfor i, x in enumerate(loader):\n    if i % 10 == 0:\n        buffer = []\n"
        "    buffer.append(model(x))\n"
    )
    assert _lines(source, "OOM302") == [6]


def test_self_containers_need_a_container_binding_in_the_class() -> None:
    source = """
        import torch
        class Evaluator:
            def __init__(self):
                self.preds = []
            def run(self, loader):
                for x in loader:
                    self.preds.append(self.model(x))
                    self.other.append(self.model(x))
    """
    assert _lines(source, "OOM302") == [8]


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nkept = []\nfor x in loader:\n    kept.append(*model(x))\n",
        "import torch\nkept = []\nfor x in loader:\n    kept.append(model(x).item())\n",
        "import torch\nkept = []\n@torch.no_grad()\ndef f():\n    for x in loader:\n        kept.append(model(x))\n",
        # validation_step runs under no_grad in Lightning, and is no loop.
        (
            "import lightning as L\nclass Lit(L.LightningModule):\n    def __init__(self):\n        self.outs = []\n"
            "    def validation_step(self, batch, i):\n        self.outs.append(self.model(batch))\n"
        ),
    ],
)
def test_storing_not_reported(source: str) -> None:
    assert _findings(source, "OOM302") == []


RECURRENT_STATE_STORED = """
    import torch
    from torch import nn

    class Policy(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(64, 32)
            self.head = nn.Linear(32, 2)

        def pi(self, x, hidden):
            x, hidden = self.lstm(x, hidden)
            return self.head(x).softmax(-1), hidden

    model = Policy()
    optimizer = torch.optim.Adam(model.parameters())
    memory = []
    h_out = (torch.zeros(1, 1, 32), torch.zeros(1, 1, 32))
    for step in range(1000):
        h_in = h_out
        prob, h_out = model.pi(torch.randn(1, 1, 64), h_in)
        memory.append((prob, h_in, h_out))
        if step % 20 == 19:
            loss = prob.log().mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
"""


def test_a_stored_recurrent_state_that_is_a_tuple_gets_no_detach_fix() -> None:
    # `h_out` starts as an (h, c) tuple: `h_out.detach()` would raise AttributeError.
    (finding,) = _findings(RECURRENT_STATE_STORED, "OOM302")
    assert finding.fix is None


def test_an_element_of_what_a_call_returned_is_detached_only_as_an_unsafe_fix() -> None:
    source = RECURRENT_STATE_STORED.replace("h_out = (torch.zeros(1, 1, 32), torch.zeros(1, 1, 32))", "h_out = None")
    (finding,) = _findings(source, "OOM302")
    assert finding.fix is not None and finding.fix.applicability.value == "unsafe"
