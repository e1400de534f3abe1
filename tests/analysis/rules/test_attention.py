"""OOM402 naive-attention, beyond its examples: when the fix must stay away,
and that a fix computes the same output."""

from __future__ import annotations

import textwrap

import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.findings import Finding


def _findings(source: str, code: str) -> list[Finding]:
    return analyze(textwrap.dedent(source), LintSettings(enabled=frozenset({code})))


def _fixed(source: str, code: str) -> str:
    return fix_source(textwrap.dedent(source), LintSettings(enabled=frozenset({code})), unsafe=True).source


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (
            "import torch\ndef f(q, k, v):\n    a = torch.softmax(q @ k.mT, dim=-1, dtype=torch.float32)\n"
            "    return a @ v\n",
            "softmax in another dtype",
        ),
        (
            "import torch\ndef f(q, k, v):\n    a = torch.softmax(q @ k.mT * self.scale, dim=-1)\n    return a @ v\n",
            "the scale may be a tensor",
        ),
        (
            "import torch\ndef f(q, k, v):\n    a = torch.softmax(q @ k.mT, dim=-1)\n    out = a @ v\n"
            "    return out, a\n",
            "the attention weights are returned too",
        ),
        (
            "import torch\ndef f(x, k, v):\n    a = torch.softmax(proj(x) @ k.mT, dim=-1)\n    return a @ v\n",
            "q is a call: it would be evaluated in another place",
        ),
        (
            "import torch\ndef f(q, k, v):\n    a = torch.softmax((q @ k.mT).masked_fill(m, -1e9), dim=-1)\n"
            "    return a @ v\n",
            "a mask",
        ),
        (
            "import torch\ndef f(q, k, v):\n    a = torch.softmax(q @ k.mT, dim=-1)\n    return v @ a\n",
            "the weights on the right",
        ),
    ],
)
def test_attention_reported_without_fix(source: str, why: str) -> None:
    findings = _findings(source, "OOM402")
    assert len(findings) == 1, why
    assert findings[0].fix is None, why


@pytest.mark.parametrize(
    "scores",
    [
        "q @ k.transpose(-2, -1)",
        "torch.matmul(q, k.transpose(-1, -2))",
        "q @ torch.transpose(k, -2, -1)",
        "q @ k.mT / 8",
        "(q @ k.mT) * 0.125",
    ],
)
def test_score_spellings_are_recognised(scores: str) -> None:
    source = f"import torch\nw = torch.softmax({scores}, dim=-1)\n"
    assert [finding.line for finding in _findings(source, "OOM402")] == [2]


def test_masked_scores_through_variables_are_recognised() -> None:
    source = """\
        import torch
        def f(q, k, v, mask):
            s = q @ k.transpose(-2, -1)
            s = s / 8
            s = s.masked_fill(mask, float("-inf"))
            p = s.softmax(-1)
            return p @ v
        """
    [finding] = _findings(source, "OOM402")
    assert finding.line == 6
    assert finding.fix is None


def test_scores_do_not_leak_across_functions() -> None:
    source = """\
        import torch
        def scores(q, k):
            s = q @ k.mT
            return s
        def probs(s):
            return s.softmax(-1)
        """
    assert _findings(source, "OOM402") == []


@pytest.mark.parametrize(
    ("scale_expression", "head_dim"),
    [
        ("/ math.sqrt(q.size(-1))", 8),
        ("* k.shape[-1] ** -0.5", 8),
        ("/ math.sqrt(16)", 8),
        ("* 0.5", 8),
        ("", 8),
    ],
)
def test_fixed_attention_computes_the_same_output(scale_expression: str, head_dim: int) -> None:
    torch = pytest.importorskip("torch")
    source = (
        "import math\nimport torch\nimport torch.nn.functional as F\n"
        "torch.manual_seed(0)\n"
        f"q, k, v = torch.randn(3, 2, 4, 6, {head_dim}).unbind(0)\n"
        f"w = F.softmax(q @ k.transpose(-2, -1) {scale_expression}, dim=-1)\n"
        "out = w @ v\n"
    )
    fixed = _fixed(source, "OOM402")
    assert "scaled_dot_product_attention" in fixed
    before: dict[str, object] = {}
    after: dict[str, object] = {}
    exec(compile(source, "<before>", "exec"), before)
    exec(compile(fixed, "<after>", "exec"), after)
    assert torch.allclose(before["out"], after["out"], atol=1e-5)


@pytest.mark.parametrize(
    ("equation", "is_query_key"),
    [
        ("bhid,bhjd->bhij", True),
        ("b h i d, b h j d -> b h i j", True),
        ("...id,...jd->...ij", True),
        ("id,jd->ij", True),
        ("bhid,bhjd->bhji", False),  # transposed scores
        ("bhid,bhje->bhij", False),  # no shared contraction
        ("bhid,bhjd->bhid", False),
        ("bhij,bhjd->bhid", False),  # weights @ v
        ("bid,bjd", False),
    ],
)
def test_einsum_query_key_equations(equation: str, is_query_key: bool) -> None:
    source = f'import torch\nw = torch.einsum("{equation}", q, k).softmax(-1)\n'
    assert bool(_findings(source, "OOM402")) is is_query_key


def test_fixed_einsum_attention_computes_the_same_output() -> None:
    torch = pytest.importorskip("torch")
    source = (
        "import math\nimport torch\nimport torch.nn.functional as F\ntorch.manual_seed(0)\n"
        "q, k, v = torch.randn(3, 2, 4, 6, 8).unbind(0)\n"
        'w = torch.softmax(torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.size(-1)), dim=-1)\n'
        "out = w @ v\n"
    )
    fixed = _fixed(source, "OOM402")
    assert "F.scaled_dot_product_attention(q, k, v)" in fixed
    before: dict[str, object] = {}
    after: dict[str, object] = {}
    exec(compile(source, "<before>", "exec"), before)
    exec(compile(fixed, "<after>", "exec"), after)
    assert torch.allclose(before["out"], after["out"], atol=1e-5)
