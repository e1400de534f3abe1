"""OOM402 naive-attention, beyond its examples: when the fix must stay away,
and that a fix computes the same output."""

from __future__ import annotations

import textwrap

import pytest

from oom_lsp.analysis import LintSettings, analyze
from oom_lsp.analysis.autofix import fix_source
from oom_lsp.analysis.findings import Finding
from oom_lsp.analysis.rules._attention_evidence import folds_windows_into_batch, moves_tokens_last


def _findings(source: str, code: str) -> list[Finding]:
    return analyze(textwrap.dedent(source), LintSettings(enabled=frozenset({code}), strict=True))


def _fixed(source: str, code: str) -> str:
    return fix_source(textwrap.dedent(source), LintSettings(enabled=frozenset({code}), strict=True), unsafe=True).source


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


_HEADER = """\
import torch
import torch.nn.functional as F
from einops import rearrange
from torch import nn
"""


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (
            """\
            class A(nn.Module):
                def forward(self, q, k, v):
                    if self.fused_attn:
                        x = F.scaled_dot_product_attention(q, k, v)
                    else:
                        attn = (q * self.scale) @ k.transpose(-2, -1)
                        attn = attn.softmax(dim=-1)
                        x = attn @ v
                    return x
            """,
            "the other branch of the `if` calls the fused kernel",
        ),
        (
            """\
            class A(nn.Module):
                def forward(self, q, k, v):
                    if self.flash:
                        y = F.scaled_dot_product_attention(q, k, v)
                    elif self.sparse:
                        y = self.sparse_attention(q, k, v)
                    else:
                        y = torch.softmax(q @ k.mT * self.scale, dim=-1) @ v
                    return y
            """,
            "the first branch of an elif chain is fused",
        ),
        (
            """\
            class A(nn.Module):
                def fused(self, q, k, v):
                    return F.scaled_dot_product_attention(q, k, v)

                def forward(self, q, k, v):
                    if self.use_flash:
                        return self.fused(q, k, v)
                    attn = torch.softmax(q @ k.mT * self.scale, dim=-1)
                    return attn @ v
            """,
            "an earlier branch returns through a method that calls the fused kernel",
        ),
        (
            """\
            from torch.nn.attention import sdpa_kernel, SDPBackend
            def patched(q, k, v, needs_eager):
                if needs_eager:
                    w = torch.softmax(q @ k.mT * 0.125, dim=-1)
                    return w @ v
                with sdpa_kernel(SDPBackend.MATH):
                    return F.scaled_dot_product_attention(q, k, v)
            """,
            "this branch returns and the code after it runs the fused kernel",
        ),
        (
            """\
            FUNCTIONS = {}
            def eager_attention(module, q, k, v):
                weights = torch.softmax(q @ k.mT * module.scale, dim=-1)
                return weights @ v
            class A(nn.Module):
                def forward(self, q, k, v):
                    attend = FUNCTIONS.get(self.config.implementation, eager_attention)
                    return attend(self, q, k, v)
            """,
            "the function is the default of a registry lookup",
        ),
        (
            """\
            class Eager(nn.Module):
                def forward(self, q, k, v):
                    probs = nn.functional.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale, dim=-1)
                    return torch.matmul(probs, v)
            class Sdpa(Eager):
                def forward(self, q, k, v):
                    return F.scaled_dot_product_attention(q, k, v)
            """,
            "a subclass replaces the method with the fused kernel",
        ),
        (
            """\
            class Eager(nn.Module):
                def forward(self, q, k, v):
                    probs = nn.functional.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale, dim=-1)
                    return torch.matmul(probs, v)
            class Fused(nn.Module):
                def forward(self, q, k, v):
                    return F.scaled_dot_product_attention(q, k, v)
            CLASSES = {"eager": Eager, "sdpa": Fused}
            """,
            "a dispatch dict names it beside a fused implementation",
        ),
        (
            """\
            class A(nn.Module):
                def forward(self, x):
                    B, N, C = x.shape
                    q = self.q(x[:, :1]).reshape(B, 1, self.heads, -1).transpose(1, 2)
                    k, v = self.kv(x).reshape(B, N, 2, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
                    attn = (q @ k.transpose(-2, -1)) * self.scale
                    return attn.softmax(dim=-1) @ v
            """,
            "the query is the class token alone",
        ),
        (
            """\
            class A(nn.Module):
                def forward(self, q, k, v, blocks):
                    blocked = q.view(q.shape[0], q.shape[1], blocks, -1, q.shape[-1])
                    first = torch.matmul(blocked[:, :, 0], k.transpose(-1, -2)) * self.scale
                    first = nn.functional.softmax(first, dim=-1)
                    return torch.matmul(first, v)
            """,
            "the queries are one block",
        ),
        (
            """\
            class A(nn.Module):
                def forward(self, x):
                    queries = self.latents.expand(x.shape[0], -1, -1)
                    sim = torch.matmul(queries, x.transpose(-1, -2)) * self.scale
                    return torch.matmul(sim.softmax(dim=-1), x)
            """,
            "the queries are a learned parameter",
        ),
        (
            """\
            class A(nn.Module):
                def forward(self, x):
                    x = rearrange(x, "b c (x w1) (y w2) -> (b x y) c w1 w2", w1=7, w2=7)
                    q, k, v = self.to_qkv(x).chunk(3, dim=1)
                    q, k, v = map(lambda t: rearrange(t, "b (h d) x y -> b h (x y) d", h=self.heads), (q, k, v))
                    attn = torch.einsum("b h i d, b h j d -> b h i j", q, k).softmax(dim=-1)
                    return torch.einsum("b h i j, b h j d -> b h i d", attn, v)
            """,
            "attention inside windows",
        ),
        (
            """\
            class A(nn.Module):
                def forward(self, x):
                    q, k, v = self.to_qkv(x).chunk(3, dim=-1)
                    q, k, v = map(lambda t: rearrange(t, "b n (h d) -> b h d n", h=self.heads), (q, k, v))
                    attn = (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)).softmax(dim=-1)
                    return attn @ v
            """,
            "channel attention through einops",
        ),
        (
            """\
            class A(nn.Module):
                def forward(self, x):
                    B, N, C = x.shape
                    q, k, v = self.qkv(x).reshape(B, N, 3, self.heads, -1).permute(2, 0, 3, 4, 1).unbind(0)
                    attn = (q @ k.transpose(-2, -1) * self.temperature).softmax(dim=-1)
                    return attn @ v
            """,
            "channel attention through permute",
        ),
        (
            """\
            class A(nn.Module):
                def forward(self, q, k, v):
                    b, h, n, d = k.shape
                    landmarks = k.reshape(b, h, self.m, n // self.m, d).mean(dim=-2)
                    kernel = torch.softmax(q @ landmarks.transpose(-1, -2), dim=-1)
                    return kernel @ self.summary(landmarks, v)
            """,
            "keys pooled into landmarks",
        ),
        (
            """\
            class A(nn.Module):
                def forward(self, q, kv):
                    kv = kv.unfold(2, self.window, self.block).unfold(3, self.window, self.block)
                    k, v = torch.split(self.to_heads(kv), [self.dk, self.dv], dim=-1)
                    attn = (q @ k.transpose(-1, -2) * self.scale).softmax(dim=-1)
                    return attn @ v
            """,
            "keys unfolded into local neighbourhoods",
        ),
        (
            """\
            class A(nn.Module):
                def get_attention(self, q, k, positional):
                    scores = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)
                    mixed = (1 - self.gate) * scores + self.gate * positional.softmax(dim=-1)
                    return mixed / mixed.sum(dim=-1, keepdim=True)
            """,
            "the weights are mixed and returned, never applied to values here",
        ),
        (
            """\
            def locality(q, k, distances):
                attention_map = (q @ k.transpose(-2, -1)).softmax(dim=-1).mean(0)
                return (distances * attention_map).sum()
            """,
            "an averaged attention map",
        ),
        (
            """\
            if flash:
                out = F.scaled_dot_product_attention(q, k, v)
            else:
                w = torch.softmax(q @ k.mT, dim=-1)
                out = w @ v
            """,
            "module-level code with a fused branch",
        ),
        (
            """\
            class Resampler(nn.Module):
                def forward(self, x, latents):
                    q = self.to_q(latents)
                    k, v = self.to_kv(torch.cat((x, latents), dim=-2)).chunk(2, dim=-1)
                    weight = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
                    return weight @ v
            """,
            "a Perceiver resampler: latent queries over the input with the latents appended",
        ),
    ],
)
def test_not_reported(source: str, why: str) -> None:
    assert _findings(_HEADER + textwrap.dedent(source), "OOM402") == [], why


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (
            """\
            class A(nn.Module):
                def forward(self, q, k, v, mask=None):
                    scores = q @ k.transpose(-2, -1) * self.scale
                    if mask is not None:
                        scores = scores.masked_fill(mask, float("-inf"))
                    else:
                        scores = scores + self.bias
                    return scores.softmax(dim=-1) @ v
            """,
            "an `if` whose other branch is no fused kernel",
        ),
        (
            """\
            class Eager(nn.Module):
                def forward(self, q, k, v):
                    probs = torch.softmax(q @ k.mT * self.scale, dim=-1)
                    return probs @ v
            CLASSES = {"eager": Eager}
            """,
            "a dispatch dict with the eager class alone",
        ),
        (
            """\
            class Eager(nn.Module):
                def forward(self, q, k, v):
                    probs = torch.softmax(q @ k.mT * self.scale, dim=-1)
                    return probs @ v
            class Variant(Eager):
                def forward(self, q, k, v):
                    return super().forward(q * 2, k, v)
            """,
            "a subclass that overrides the method without a fused kernel",
        ),
        (
            """\
            class A(nn.Module):
                def forward(self, x):
                    B, N, C = x.shape
                    qkv = self.qkv(x).reshape(B, N, 3, self.heads, -1)
                    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
                    attn = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-2, -1)).softmax(dim=-1)
                    return attn @ v.transpose(1, 2)
            """,
            "a packed qkv split by index: queries and keys from the same tensor",
        ),
        (
            """\
            class A(nn.Module):
                def forward(self, x):
                    q, k, v = self.to_qkv(x).chunk(3, dim=1)
                    q, k, v = map(lambda t: rearrange(t, "b (h d) x y -> (b h) (x y) d", h=self.heads), (q, k, v))
                    attn = torch.einsum("b i d, b j d -> b i j", q, k).softmax(dim=-1)
                    return torch.einsum("b i j, b j d -> b i d", attn, v)
            """,
            "heads folded into the batch: still global",
        ),
        (
            """\
            class A(nn.Module):
                def forward(self, x, context=None):
                    context = x if context is None else torch.cat((x, context), dim=1)
                    q, k, v = self.to_q(x), *self.to_kv(context).chunk(2, dim=-1)
                    attn = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)
                    return attn @ v
            """,
            "cross-attention whose keys include the queries' tokens",
        ),
        (
            """\
            class A(nn.Module):
                def forward(self, x):
                    q, k, v = self.qkv(x).chunk(3, dim=-1)
                    q = q[..., :64]
                    attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
                    return attn @ v
            """,
            "a slice after `...` cuts features, not positions",
        ),
        (
            """\
            class A(nn.Module):
                def forward(self, q, k, v):
                    weights = torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1).to(q.dtype)
                    return self.attend(q, k, v)
            """,
            "a score matrix built and never used",
        ),
        (
            """\
            class LatentSelfAttention(nn.Module):
                def forward(self, latents):
                    q, k, v = self.to_q(latents), self.to_k(latents), self.to_v(latents)
                    return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
            """,
            "self-attention over a diffusion model's latents is tokens x tokens",
        ),
        (
            """\
            class CrossAttention(nn.Module):
                def forward(self, x, context):
                    q = self.to_q(x)
                    k, v = self.to_kv(torch.cat((x, context), dim=1)).chunk(2, dim=-1)
                    return torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v
            """,
            "queries from every token, keys from the tokens and a context",
        ),
    ],
)
def test_still_reported(source: str, why: str) -> None:
    assert len(_findings(_HEADER + textwrap.dedent(source), "OOM402")) == 1, why


@pytest.mark.parametrize(
    ("pattern", "windows", "tokens_last"),
    [
        ("b c (x w1) (y w2) -> (b x y) c w1 w2", True, False),
        ("b d (l1 h) (l2 w) -> (b h w) d l1 l2", True, False),
        ("b (h d) (x w1) (y w2) -> (b x y) h (w1 w2) d", True, False),
        ("b (h d) x y -> (b h) (x y) d", False, False),  # heads into the batch
        ("b n (h d) -> b h n d", False, False),
        ("b n (h d) -> b h d n", False, True),  # cross-covariance
        ("b c (h p1) (w p2) -> b (h w) (p1 p2 c)", False, False),  # patch embedding
        ("b (h d) x y -> b h (x y) d", False, False),
        ("b n (h d", False, False),
    ],
)
def test_einops_patterns(pattern: str, windows: bool, tokens_last: bool) -> None:
    assert folds_windows_into_batch(pattern) is windows
    assert moves_tokens_last(pattern) is tokens_last
