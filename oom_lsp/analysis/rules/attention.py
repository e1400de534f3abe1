"""OOM402: attention that materialises the full score matrix."""

from __future__ import annotations

import re
from typing import NamedTuple

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.cst_helpers import bound_arguments, get_arg, has_splat, method_call, string_value
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.rule import FixSpec, Invalid, Rule, Valid
from oom_lsp.analysis.rules._attention_evidence import (
    BROADCAST_METHODS,
    WEIGHT_PRESERVING_FUNCTIONS,
    WEIGHT_PRESERVING_METHODS,
    FileIndex,
    Scope,
    ends_in_exit,
    folds_windows_into_batch,
    is_fused_kernel,
    method_named,
    moves_tokens_last,
    names_read_by,
    permutes_tokens_last,
    pools_positions,
    selects_fixed_length,
    statements_of,
)
from oom_lsp.analysis.rules._scan import (
    children,
    descendants,
    enclosing_block,
    names_read,
    references,
    scope_of,
    single_assignment,
)
from oom_lsp.analysis.rules._tensor_shapes import Lookup, TensorShapes
from oom_lsp.fixes.attention import fused_attention

_CONCATENATE = frozenset({"torch.cat", "torch.concat", "torch.concatenate"})
_SOFTMAX = {"torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"}
_MATMUL = {"torch.matmul", "torch.bmm"}
# Operations that keep a score matrix a score matrix (masking, casting).
_SCORE_PRESERVING_METHODS = {
    "masked_fill", "masked_fill_", "float", "to", "type_as", "contiguous",
    # The arithmetic operators as methods: `scores.div(d ** 0.5)` is `scores / d ** 0.5`.
    "div", "div_", "mul", "mul_", "add", "add_", "sub", "sub_",
}  # fmt: skip
# Tensor methods that are the same product as `torch.matmul` / `torch.bmm`.
_MATMUL_METHODS = frozenset({"matmul", "bmm"})


def _is_minus(expr: cst.BaseExpression, value: int) -> bool:
    return (
        isinstance(expr, cst.UnaryOperation)
        and isinstance(expr.operator, cst.Minus)
        and isinstance(expr.expression, cst.Integer)
        and expr.expression.value == str(value)
    )


def _swaps_last_two(first: cst.BaseExpression, second: cst.BaseExpression) -> bool:
    return (_is_minus(first, 2) and _is_minus(second, 1)) or (_is_minus(first, 1) and _is_minus(second, 2))


# (q, k) of a score product, and with the code of its `scale=` argument.
_QueryKey = tuple[cst.BaseExpression, cst.BaseExpression]
_ScaledProduct = tuple[cst.BaseExpression, cst.BaseExpression, "str | None"]


def _power_base(expr: cst.BaseExpression, exponent: str) -> cst.BaseExpression | None:
    """`x` for `x ** 0.5` (exponent "0.5") or `x ** -0.5` ("-0.5")."""
    if not isinstance(expr, cst.BinaryOperation) or not isinstance(expr.operator, cst.Power):
        return None
    power = expr.right
    if exponent.startswith("-"):
        if not (isinstance(power, cst.UnaryOperation) and isinstance(power.operator, cst.Minus)):
            return None
        power, exponent = power.expression, exponent[1:]
    return expr.left if isinstance(power, cst.Float) and power.value == exponent else None


class _Softmax(NamedTuple):
    input: cst.BaseExpression
    last_dim: bool
    input_and_dim_only: bool


def _is_query_key_equation(equation: str, any_layout: bool = False) -> bool:
    """`bhid,bhjd->bhij` (or `...id,...jd->...ij`): q @ k^T over the last two
    dimensions, the leading ones shared. With `any_layout`, any equation that
    is a score product: one letter contracted (the features), one kept from
    each side (queries i, keys j), the rest shared by both inputs and the
    output, and the output ending in i, j (`bct,bcs->bts`, channels first)."""
    spec = equation.replace(" ", "")
    inputs, arrow, output = spec.partition("->")
    operands = inputs.split(",")
    if not arrow or len(operands) != 2:
        return False
    query, key = operands
    if any_layout and _is_score_product(query, key, output):
        return True
    if not (len(query) == len(key) == len(output) >= 2):
        return False
    prefix = query[:-2]
    i, d, j = query[-2], query[-1], key[-2]
    letters = (i, j, d)
    return (
        key == prefix + j + d
        and output == prefix + i + j
        and len(set(letters)) == 3
        and all(letter.isalpha() for letter in letters)
        and not set(letters) & set(prefix)
    )


def _is_matrix_product(equation: str) -> bool:
    """`bij,bjk->bik` (or `...ij,...jk->...ik`): a batched matrix product,
    what `@` computes, the leading axes shared."""
    spec = equation.replace(" ", "")
    inputs, arrow, output = spec.partition("->")
    operands = inputs.split(",")
    if not arrow or len(operands) != 2:
        return False
    left, right = operands
    if not (len(left) == len(right) == len(output) >= 2):
        return False
    prefix = left[:-2]
    i, j, k = left[-2], left[-1], right[-1]
    letters = (i, j, k)
    return (
        right == prefix + j + k
        and output == prefix + i + k
        and len(set(letters)) == 3
        and all(letter.isalpha() for letter in letters)
        and not set(letters) & set(prefix)
    )


def _is_score_product(query: str, key: str, output: str) -> bool:
    # Every axis named: leading `...` in another layout is how block-local
    # attention is written (LongT5's `...qhd,...khd->...hqk` over blocks),
    # scores linear in the sequence.
    operands = (query, key, output)
    if not all(side.isalpha() and len(set(side)) == len(side) for side in operands):
        return False
    shared = set(query) & set(key) & set(output)
    contracted = (set(query) & set(key)) - set(output)
    only_query = set(query) - set(key)
    only_key = set(key) - set(query)
    if len(contracted) != 1 or len(only_query) != 1 or len(only_key) != 1:
        return False
    (i,), (j,) = only_query, only_key
    # Queries and keys in one layout (each a projection of the tokens): they
    # differ only where one has its tokens i and the other its tokens j. The
    # weights times the values (`bhij,bhjd->bhid`) contract j at different
    # places and are no score product.
    same_layout = len(query) == len(key) and [a == b for a, b in zip(query, key)].count(False) == 1
    return same_layout and query.index(i) == key.index(j) and set(output) == shared | {i, j} and output.endswith(i + j)


def _is_number(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, (cst.Integer, cst.Float))


class NaiveAttention(Rule):
    """
    ## What it does
    Flags attention computed by hand: a softmax over the last dimension of
    `q @ k.transpose(-2, -1)` (or `k.mT`, `torch.matmul`, an einsum such as
    `"bhid,bhjd->bhij"`, an einsum that is a matrix product, `"bij,bjk->bik"`,
    of a transposed key, a key transposed into a name first, or
    `k.transpose(2, 3)` of a key whose four dimensions the code states: its
    `view`, a shape unpacked from it, a helper of the file that returns a
    stated shape, one generator that makes q, k and v alike, kept through a
    rotary-embedding helper, a norm layer or `repeat_interleave`),
    scaled, masked or
    not, directly or through a variable (`scores = q @ k.mT / d ** 0.5`, then
    `scores.softmax(-1)`), with `torch.softmax`, `F.softmax`, `.softmax()` or
    an `nn.Softmax(dim=-1)` module, whose result is multiplied with another
    tensor (`attn @ v`) or never used at all.

    It stays silent where the code says this is not the path that runs, or
    not a sequence x sequence matrix:
    - a fused path beside it: the other branch of the `if` (or an earlier
      branch that returns, or the code after this branch's `return`) calls
      `scaled_dot_product_attention`, flash-attn or xformers, directly or
      through a method or function of the file;
    - one implementation of a dispatch: a module-level function passed as
      the default of a registry lookup (`FUNCTIONS.get(impl, eager)`), a
      class named in a dict beside a fused one, or a class whose subclass
      overrides the method with a fused kernel;
    - queries or keys of a fixed length: a learned parameter (`self.latents`),
      queries taken at fixed positions (`x[:, :1]`, one block
      `blocks[:, :, 0]`) of a tensor the keys do not come from, tokens
      pooled (`.mean(dim=-2)`, landmarks), unfolded into neighbourhoods
      (`Tensor.unfold`) or regrouped into windows
      (`rearrange(x, "b c (x w1) (y w2) -> (b x y) c w1 w2")`);
    - the tokens on the contracted axis (channel attention,
      `"b n (h d) -> b h d n"`, `.permute(2, 0, 3, 4, 1)`): scores are d x d;
    - weights mixed, reduced or returned without meeting values (an
      attention map computed for itself): the fused kernels do not replace it.

    ## Why is this bad?
    The score matrix has one entry per pair of positions: batch x heads x
    seq x seq. At 32 heads and 8k tokens that is 2 G elements, 4 GB in bf16
    per sample, and autograd keeps both the scores and their softmax (plus
    any mask and dropout copies) until backward. The memory grows with the
    square of the sequence length, and it is what runs out first on long
    inputs. `scaled_dot_product_attention` dispatches to fused kernels
    (FlashAttention, memory-efficient attention) that never store the matrix.

    ## Example
    ```python
    attn = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    out = attn @ v
    ```

    ## Use instead
    ```python
    out = F.scaled_dot_product_attention(q, k, v)
    ```

    ## Fix safety
    Safe, and offered only for the plain pattern whose result is
    mathematically the same: the scores (inline or in a variable used only
    there), a softmax over `dim=-1` with no other argument, and the next
    statement multiplying it by `v`, with `q`, `k`, `v` plain names and the
    intermediate variables used nowhere else. The scale is kept: none when it
    is provably `1/sqrt(q.size(-1))` (the kernel's default), `scale=...` when
    it is a float expression (`math.sqrt(d)`, a literal), `scale=1.0` when
    there is none; a scale that may be a tensor (`self.scale`) gets no fix.
    Masks and dropout between the softmax and `@ v` get no fix either: a mask
    maps onto `attn_mask`/`is_causal` only when its content is known. Results
    agree up to floating-point rounding (the fused kernels sum in another
    order). `scaled_dot_product_attention` needs torch >= 2.0, its `scale=`
    torch >= 2.1.
    """

    code = "OOM402"
    name = "naive-attention"
    summary = "Attention computed by hand materialises the full sequence x sequence score matrix."
    why = (
        "The score matrix grows with the square of the sequence length, and autograd keeps it and its "
        "softmax until backward."
    )
    remedy = "Use torch.nn.functional.scaled_dot_product_attention, whose fused kernels never store it."
    fix_applicability = Applicability.SAFE

    VALID = [
        Valid(
            """\
            import torch.nn.functional as F
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            """
        ),
        # A softmax over logits, not over q k^T.
        Valid("import torch\nprobs = torch.softmax(model(x), dim=-1)\n"),
        # q @ k^T without a softmax (e.g. a similarity score).
        Valid("import torch\nsim = q @ k.transpose(-2, -1)\nloss = sim.mean()\n"),
        # Softmax over another dimension than the keys'.
        Valid("import torch\nw = torch.softmax(q @ k.transpose(-2, -1), dim=1)\n"),
        # A local `softmax` function is not torch's.
        Valid(
            """\
            def softmax(x, dim):
                return x
            w = softmax(q @ k.transpose(-2, -1), dim=-1)
            """
        ),
        # The dim may come through a splat.
        Valid("import torch\nw = torch.softmax(q @ k.transpose(-2, -1), **options)\n"),
        # einsum that is not q k^T (a contraction over the sequence).
        Valid('import torch\nw = torch.einsum("bhid,bhje->bhde", q, k).softmax(-1)\n'),
        # A softmax module over another dimension.
        Valid(
            """\
            import torch.nn as nn
            class Attention(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.softmax = nn.Softmax(dim=1)
                def forward(self, q, k):
                    return self.softmax(q @ k.transpose(-2, -1))
            """
        ),
        # The scores variable was rebound to something else before the softmax.
        Valid(
            """\
            import torch
            scores = q @ k.transpose(-2, -1)
            scores = logits_of(batch)
            p = scores.softmax(-1)
            """
        ),
        # The fallback branch of a fused path.
        Valid(
            """\
            import torch.nn.functional as F
            from torch import nn

            class Attention(nn.Module):
                def forward(self, q, k, v):
                    if self.fused_attn:
                        return F.scaled_dot_product_attention(q, k, v)
                    attn = (q @ k.transpose(-2, -1)) * self.scale
                    return attn.softmax(dim=-1) @ v
            """
        ),
        # The fallback of an optional import: the name is the kernel wherever it is called.
        Valid(
            """\
            import torch.nn.functional as F
            try:
                from torch.nn.functional import scaled_dot_product_attention
            except ImportError:
                scaled_dot_product_attention = None

            def attention(q, k, v):
                if scaled_dot_product_attention is not None:
                    out = scaled_dot_product_attention(q, k, v)
                else:
                    out = F.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
                return out
            """
        ),
        # The eager entry of a registry of attention functions.
        Valid(
            """\
            import torch

            def eager_attention(module, q, k, v):
                weights = torch.softmax(q @ k.mT * module.scaling, dim=-1)
                return weights @ v

            class Attention(torch.nn.Module):
                def forward(self, q, k, v):
                    attend = ATTENTION_FUNCTIONS.get(self.config.implementation, eager_attention)
                    return attend(self, q, k, v)
            """
        ),
        # An eager class whose SDPA subclass replaces its forward.
        Valid(
            """\
            import torch
            import torch.nn.functional as F

            class SelfAttention(torch.nn.Module):
                def forward(self, q, k, v):
                    probs = torch.softmax(torch.matmul(q, k.transpose(-1, -2)) * self.scale, dim=-1)
                    return torch.matmul(probs, v)

            class SdpaSelfAttention(SelfAttention):
                def forward(self, q, k, v):
                    return F.scaled_dot_product_attention(q, k, v)
            """
        ),
        # The class token alone queries the patches: scores are 1 x N.
        Valid(
            """\
            from torch import nn

            class ClassAttention(nn.Module):
                def forward(self, x):
                    B, N, C = x.shape
                    q = self.q(x[:, :1]).reshape(B, 1, self.heads, -1).transpose(1, 2)
                    k, v = self.kv(x).reshape(B, N, 2, self.heads, -1).permute(2, 0, 3, 1, 4).unbind(0)
                    attn = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)
                    return attn @ v
            """
        ),
        # Learned queries (a resampler): scores are num_queries x N.
        Valid(
            """\
            import torch

            def merge(self, x):
                sim = torch.matmul(self.queries, x.transpose(-1, -2)) * self.scale
                return torch.matmul(sim.softmax(dim=-1), x)
            """
        ),
        # Attention inside 7 x 7 windows: linear in the image area.
        Valid(
            """\
            import torch
            from einops import rearrange

            def window_attention(self, x):
                x = rearrange(x, "b c (x w1) (y w2) -> (b x y) c w1 w2", w1=7, w2=7)
                q, k, v = self.to_qkv(x).chunk(3, dim=1)
                q, k, v = map(lambda t: rearrange(t, "b (h d) x y -> b h (x y) d", h=self.heads), (q, k, v))
                attn = torch.einsum("b h i d, b h j d -> b h i j", q, k).softmax(dim=-1)
                return torch.einsum("b h i j, b h j d -> b h i d", attn, v)
            """
        ),
        # Cross-covariance (channel) attention: the scores are d x d.
        Valid(
            """\
            from einops import rearrange

            def channel_attention(self, x):
                q, k, v = self.to_qkv(x).chunk(3, dim=-1)
                q, k, v = map(lambda t: rearrange(t, "b n (h d) -> b h d n", h=self.heads), (q, k, v))
                attn = (q @ k.transpose(-2, -1) * self.temperature).softmax(dim=-1)
                return attn @ v
            """
        ),
        # An attention map mixed and returned, not applied to values here.
        Valid(
            """\
            def gated_map(self, q, k, positional):
                scores = (q @ k.transpose(-2, -1) * self.scale).softmax(dim=-1)
                return (1 - self.gate) * scores + self.gate * positional
            """
        ),
        # A function of the file that returns a new tensor (pooled scores),
        # not the matrix it was given.
        Valid(
            """\
            import torch

            def pooled(attn, size):
                out = attn.mean(-1, keepdim=True).expand(-1, -1, -1, size)
                return out

            def attend(q, k, v):
                attn = q @ k.transpose(-2, -1)
                attn = pooled(attn, v.size(-2))
                attn = attn.softmax(dim=-1)
                return attn @ v
            """
        ),
        # Five dimensions: `transpose(2, 3)` swaps heads and tokens, not the
        # last two, so `q @ k` here is no score matrix.
        Valid(
            """\
            import torch

            def mix(q, k, b, t, g, h, d):
                k = k.view(b, t, g, h, d)
                w = torch.softmax(q @ k.transpose(2, 3), dim=-1)
                return w @ k
            """
        ),
        # A helper of the file that splits the keys into windows: five
        # dimensions after it, so `transpose(2, 3)` is not their last two.
        Valid(
            """\
            import torch

            def split_windows(x, size):
                b, h, t, d = x.shape
                return x.view(b, h, t // size, size, d)

            def attend(q, k, v, b, t, h, d):
                k = split_windows(k.view(b, t, h, d).transpose(1, 2), 8)
                w = torch.softmax(q @ k.transpose(2, 3), dim=-1)
                return w @ v
            """
        ),
        # Channel attention on a feature map: `bmm` of `(b, c, h*w)` by
        # `(b, h*w, c)` is channels by channels (DANet's CAM).
        Valid(
            """\
            import torch

            def channel_attention(self, x):
                b, c, h, w = x.shape
                query = x.view(b, c, -1)
                key = x.view(b, c, -1).permute(0, 2, 1)
                energy = torch.bmm(query, key)
                attention = torch.softmax(energy, dim=-1)
                return torch.bmm(attention, x.view(b, c, -1)).view(b, c, h, w)
            """
        ),
    ]
    INVALID = [
        Invalid(
            """\
            import math
            import torch
            import torch.nn.functional as F

            def attention(q, k, v):
                attn = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
                out = attn @ v  # (B, H, T, D)
                return out
            """,
            line=6,
            expected_fix="""\
            import math
            import torch
            import torch.nn.functional as F

            def attention(q, k, v):
                out = F.scaled_dot_product_attention(q, k, v)  # (B, H, T, D)
                return out
            """,
        ),
        # Through a variable, a method softmax, a scale that is not the default.
        Invalid(
            """\
            import math
            import torch

            class Head(torch.nn.Module):
                def forward(self, q, k, v):
                    scores = torch.matmul(q, k.mT) / math.sqrt(self.head_dim)
                    weights = scores.softmax(dim=-1)
                    return torch.matmul(weights, v)
            """,
            line=7,
            expected_fix="""\
            import math
            import torch

            class Head(torch.nn.Module):
                def forward(self, q, k, v):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=1 / math.sqrt(self.head_dim))
            """,
        ),
        # No scale at all; F spelled through `import torch as T`.
        Invalid(
            """\
            import torch as T
            w = T.nn.functional.softmax(
                q @ k.transpose(-1, -2),
                dim=-1,
            )
            y = w @ v
            """,
            line=2,
            expected_fix="""\
            import torch as T
            y = T.nn.functional.scaled_dot_product_attention(q, k, v, scale=1.0)
            """,
        ),
        # The import of torch.nn.functional is added when nothing binds it.
        Invalid(
            """\
            from torch import softmax

            def attend(q, k, v):
                p = softmax(q @ k.transpose(-2, -1) * q.size(-1) ** -0.5, -1)
                return p @ v
            """,
            line=4,
            expected_fix="""\
            from torch import softmax
            import torch.nn.functional

            def attend(q, k, v):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v)
            """,
        ),
        # A mask and dropout between: reported, no fix.
        Invalid(
            """\
            import torch
            import torch.nn.functional as F
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            att = self.attn_drop(att)
            y = att @ v
            """,
            line=5,
        ),
        # An `nn.Softmax(dim=-1)` module.
        Invalid(
            """\
            import math
            import torch.nn as nn
            import torch.nn.functional as F

            class ScaledDotProductAttention(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.softmax = nn.Softmax(dim=-1)

                def forward(self, q, k, v):
                    score = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
                    attn = self.softmax(score)
                    return attn @ v
            """,
            line=12,
            expected_fix="""\
            import math
            import torch.nn as nn
            import torch.nn.functional as F

            class ScaledDotProductAttention(nn.Module):
                def __init__(self):
                    super().__init__()
                    self.softmax = nn.Softmax(dim=-1)

                def forward(self, q, k, v):
                    return F.scaled_dot_product_attention(q, k, v)
            """,
        ),
        # Scores through einsum (the weights are used twice: no fix).
        Invalid(
            """\
            from torch import einsum
            sim = einsum("b h i d, b h j d -> b h i j", q, k) * self.scale
            attn = sim.softmax(dim=-1)
            out = einsum("b h i j, b h j d -> b h i d", attn, v)
            """,
            line=3,
        ),
        # A scale that may be a tensor: reported, no fix.
        Invalid(
            """\
            import torch
            attn = (q @ k.transpose(-2, -1)) * self.scale
            attn = attn.softmax(dim=-1)
            x = attn @ v
            """,
            line=3,
        ),
        # The only path of the model: an `if` for the mask is no fused path,
        # and a dispatch dict that names this class alone is no choice.
        Invalid(
            """\
            import torch
            from torch import nn

            class SelfAttention(nn.Module):
                def forward(self, q, k, v, mask=None):
                    scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
                    if mask is not None:
                        scores = scores + mask
                    probs = nn.functional.softmax(scores, dim=-1)
                    probs = self.dropout(probs)
                    return torch.matmul(probs, v), probs

            SELF_ATTENTION_CLASSES = {"eager": SelfAttention}
            """,
            line=9,
        ),
        # A function of the file adds a relative-position bias and hands the
        # same matrix back: still the scores (MViTv2's attention).
        Invalid(
            """\
            import torch

            def add_rel_pos(attn, q, rel_pos):
                attn[:, :, 1:, 1:] += q[:, :, 1:] @ rel_pos
                return attn

            def attend(q, k, v, rel_pos, use_rel_pos):
                attn = (q * 0.125) @ k.transpose(-2, -1)
                if use_rel_pos:
                    attn = add_rel_pos(attn, q, rel_pos)
                attn = attn.softmax(dim=-1)
                return attn @ v
            """,
            line=11,
        ),
        # Heads split by `view`, so `transpose(2, 3)` is the key's last two
        # dimensions (LLMs-from-scratch's MultiHeadAttention).
        Invalid(
            """\
            import torch

            def attend(x, wq, wk, wv, b, t, h, d):
                keys = wk(x).view(b, t, h, d).transpose(1, 2)
                queries = wq(x).view(b, t, h, d).transpose(1, 2)
                values = wv(x).view(b, t, h, d).transpose(1, 2)
                scores = queries @ keys.transpose(2, 3)
                weights = torch.softmax(scores / keys.shape[-1] ** 0.5, dim=-1)
                return weights @ values
            """,
            line=8,
        ),
        # Channels first: `einsum("bct,bcs->bts")` is q^T k, scores all the
        # same (the QKVAttention of guided-diffusion UNets); no fix (not the
        # kernel's layout).
        Invalid(
            """\
            import torch

            def qkv_attention(q, k, v, scale):
                weight = torch.einsum("bct,bcs->bts", q * scale, k * scale)
                weight = torch.softmax(weight.float(), dim=-1).type(weight.dtype)
                return torch.einsum("bts,bcs->bct", weight, v)
            """,
            line=5,
        ),
        # A helper that rebinds the matrix to itself plus a bias, reshaped
        # (segment-anything's decomposed relative positions).
        Invalid(
            """\
            import torch

            def add_rel_pos(attn, rel_h, rel_w, b, h, w):
                attn = (attn.view(b, h, w, h, w) + rel_h + rel_w).view(b, h * w, h * w)
                return attn

            def attend(q, k, v, rel_h, rel_w, b, h, w):
                attn = (q * 0.125) @ k.transpose(-2, -1)
                attn = add_rel_pos(attn, rel_h, rel_w, b, h, w)
                attn = attn.softmax(dim=-1)
                return attn @ v
            """,
            line=10,
        ),
        # Grouped-query attention: the keys' four dimensions stated by their
        # `view`, kept through a norm layer of the file, a rotary-embedding
        # helper and `repeat_interleave` (LLMs-from-scratch's Llama 3, Qwen3).
        Invalid(
            """\
            import torch
            import torch.nn as nn

            class RMSNorm(nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.scale = nn.Parameter(torch.ones(dim))

                def forward(self, x):
                    variance = x.pow(2).mean(dim=-1, keepdim=True)
                    if self.training:
                        x = x.float()
                    return (x * torch.rsqrt(variance + 1e-6) * self.scale).type_as(x)

            def rotate(x, cos, sin):
                b, h, t, d = x.shape
                first, second = x[..., : d // 2], x[..., d // 2 :]
                turned = torch.cat((-second, first), dim=-1)
                return (x * cos[:t]) + (turned * sin[:t])

            class GroupedAttention(nn.Module):
                def __init__(self, dim, heads, groups, qk_norm):
                    super().__init__()
                    self.heads, self.groups, self.head_dim = heads, groups, dim // heads
                    self.wq = nn.Linear(dim, dim)
                    self.wkv = nn.Linear(dim, 2 * groups * self.head_dim)
                    self.k_norm = RMSNorm(self.head_dim) if qk_norm else None

                def forward(self, x, cos, sin):
                    b, t, _ = x.shape
                    queries = self.wq(x).view(b, t, self.heads, self.head_dim).transpose(1, 2)
                    keys, values = self.wkv(x).view(b, t, 2 * self.groups, self.head_dim).transpose(1, 2).chunk(2, dim=1)
                    keys = keys.view(b, self.groups, t, self.head_dim)
                    if self.k_norm is not None:
                        keys = self.k_norm(keys)
                    queries = rotate(queries, cos, sin)
                    keys = rotate(keys, cos, sin)
                    keys = keys.repeat_interleave(self.heads // self.groups, dim=1)
                    values = values.repeat_interleave(self.heads // self.groups, dim=1)
                    scores = queries @ keys.transpose(2, 3)
                    weights = torch.softmax(scores / self.head_dim ** 0.5, dim=-1)
                    return weights @ values
            """,
            line=41,
        ),
        # Attention over the positions of a feature map, channels first:
        # `bmm` of `(b, h*w, c)` by `(b, c, h*w)` is positions by positions
        # (the AttnBlock of latent-diffusion and taming-transformers).
        Invalid(
            """\
            import torch

            def attend(q, k, v):
                b, c, h, w = q.shape
                q = q.reshape(b, c, h * w)
                q = q.permute(0, 2, 1)
                k = k.reshape(b, c, h * w)
                w_ = torch.bmm(q, k)
                w_ = w_ * (int(c) ** (-0.5))
                w_ = torch.nn.functional.softmax(w_, dim=2)
                v = v.reshape(b, c, h * w)
                w_ = w_.permute(0, 2, 1)
                return torch.bmm(v, w_).reshape(b, c, h, w)
            """,
            line=10,
        ),
        # The same with a softmax module and `-1` for the flattened positions
        # (SAGAN's self-attention; DANet's position attention).
        Invalid(
            """\
            import torch
            import torch.nn as nn

            class SelfAttention(nn.Module):
                def __init__(self, dim):
                    super().__init__()
                    self.query = nn.Conv2d(dim, dim // 8, 1)
                    self.key = nn.Conv2d(dim, dim // 8, 1)
                    self.value = nn.Conv2d(dim, dim, 1)
                    self.softmax = nn.Softmax(dim=-1)

                def forward(self, x):
                    batch, channels, width, height = x.size()
                    query = self.query(x).view(batch, -1, width * height).permute(0, 2, 1)
                    key = self.key(x).view(batch, -1, width * height)
                    attention = self.softmax(torch.bmm(query, key))
                    value = self.value(x).view(batch, -1, width * height)
                    out = torch.bmm(value, attention.permute(0, 2, 1))
                    return out.view(batch, channels, width, height)
            """,
            line=16,
        ),
        # A score matrix built and never used.
        Invalid(
            """\
            import torch

            def block(self, q, k, v):
                weights = torch.softmax(q @ k.transpose(-2, -1) * self.scale, dim=-1).to(q.dtype)
                return self.attend(q, k, v)
            """,
            line=4,
        ),
        # einsum as a batched matrix product, the key transposed into a name,
        # its rank stated by a helper of the class.
        Invalid(
            """
            import torch
            import torch.nn as nn

            class Attention(nn.Module):
                def _split(self, t, b, n):
                    return t.view(b, n, self.h, self.d).transpose(1, 2).reshape(b * self.h, n, self.d)

                def forward(self, x):
                    b, n, c = x.shape
                    q, k, v = self._split(self.q(x), b, n), self._split(self.k(x), b, n), self._split(self.v(x), b, n)
                    k_t = k.transpose(1, 2)
                    logits = torch.einsum("bij,bjk->bik", q, k_t) * self.scale
                    return torch.einsum("bij,bjk->bik", logits.softmax(dim=-1), v)
            """,
            line=14,
        ),
        # Queries and keys made by one generator, their four dimensions stated.
        Invalid(
            """
            import torch
            import torch.nn as nn

            class Attention(nn.Module):
                def forward(self, x):
                    b, n, _ = x.shape
                    q, k, v = (t.view(b, n, self.h, self.d).permute(0, 2, 1, 3) for t in self.qkv(x).chunk(3, dim=-1))
                    energy = q @ k.transpose(2, 3) / self.d ** 0.5
                    return torch.softmax(energy, dim=-1) @ v
            """,
            line=10,
        ),
        # The products and the arithmetic as tensor methods: `q.matmul(...)`,
        # `.div(...)`, `.softmax(-1)`.
        Invalid(
            """\
            import torch.nn as nn

            class Block(nn.Module):
                def split(self, x):
                    b, t, d = x.shape
                    return x.view(b, t, self.h, d // self.h).transpose(1, 2)

                def forward(self, x):
                    q, k, v = self.split(self.q(x)), self.split(self.k(x)), self.split(self.v(x))
                    w = q.matmul(k.transpose(-2, -1)).div(q.shape[-1] ** 0.5)
                    w = w.softmax(-1)
                    return w.matmul(v)
            """,
            line=11,
        ),
        # Heads split by a function nested in the forward: `transpose(3, 2)` of
        # its four dimensions, a bias added in place.
        Invalid(
            """\
            import torch
            import torch.nn.functional as F

            def forward(self, hidden_states):
                batch_size = hidden_states.shape[0]

                def shape(states):
                    return states.view(batch_size, -1, self.n_heads, self.d_kv).transpose(1, 2)

                query_states = shape(self.q(hidden_states))
                key_states = shape(self.k(hidden_states))
                scores = torch.matmul(query_states, key_states.transpose(3, 2))
                scores += self.position_bias
                weights = F.softmax(scores.float(), dim=-1).type_as(scores)
                return torch.matmul(weights, shape(self.v(hidden_states)))
            """,
            line=14,
        ),
    ]

    # Every form it flags applies torch's softmax: `torch.softmax`, `F.softmax`,
    # `.softmax()` or `nn.Softmax`, spelled in this file (an alias is imported by name).
    needs_any_of = ("softmax", "Softmax")

    def __init__(self, context) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context)
        # Per function: the local names currently holding a score matrix, with
        # the (q, k) of its product.
        self._scores: list[dict[str, _QueryKey]] = [{}]
        # Per function: the local names bound to a key with its last two
        # dimensions swapped (`k_t = k.transpose(1, 2)` of a 3-D key), with that key.
        self._transposed: list[dict[str, cst.BaseExpression]] = [{}]
        # Per function: the local names whose shape the code states.
        self._shapes = TensorShapes(context.call_name)
        # Names and attributes bound to `nn.Softmax(dim=-1)` (False once bound
        # to anything else).
        self._softmax_modules: dict[str, bool] = {}
        # Built for the first candidate of the file, by node id.
        self._file_index: FileIndex | None = None
        self._scopes: dict[int, Scope] = {}
        self._fused_bodies: dict[int, bool] = {}

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scores.append({})
        self._transposed.append({})
        self._shapes.enter()

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._scores.pop()
        self._transposed.pop()
        self._shapes.leave()

    def leave_Assign(self, original_node: cst.Assign) -> None:
        self._rebind([target.target for target in original_node.targets], original_node.value)
        for target in original_node.targets:
            name = dotted_name(target.target)
            if name is not None:
                is_softmax = self._is_last_dim_softmax_module(original_node.value)
                self._softmax_modules[name] = is_softmax and self._softmax_modules.get(name, True)

    def _is_last_dim_softmax_module(self, value: cst.BaseExpression) -> bool:
        if not isinstance(value, cst.Call) or self.context.call_name(value) != "torch.nn.Softmax":
            return False
        dim = get_arg(value, "dim", 0)
        return isinstance(dim, cst.Arg) and _is_minus(dim.value, 1)

    def leave_AnnAssign(self, original_node: cst.AnnAssign) -> None:
        if original_node.value is not None:
            self._rebind([original_node.target], original_node.value)

    def _rebind(self, targets: list[cst.BaseExpression], value: cst.BaseExpression) -> None:
        names = self._scores[-1]
        transposed = self._transposed[-1]
        product = self._score_operands(value)
        key = self._key_of_transposed(value)
        for target in targets:
            if isinstance(target, cst.Name):
                names.pop(target.value, None)
                transposed.pop(target.value, None)
                if product is not None:
                    names[target.value] = product
                if key is not None:
                    transposed[target.value] = key  # `k_t = k.transpose(1, 2)`
                continue
            for node in descendants(target):
                if isinstance(node, cst.Name):
                    names.pop(node.value, None)
        self._shapes.rebind(targets, value, self._lookup())

    def _owner(self) -> cst.ClassDef | None:
        stack = self.context.tracker.statements
        return stack[0] if stack and isinstance(stack[0], cst.ClassDef) else None

    # --- recognising the score matrix --------------------------------------
    def _key_of_transposed(self, expr: cst.BaseExpression) -> cst.BaseExpression | None:
        """`k` for `k.transpose(-2, -1)`, `k.transpose(-1, -2)`, `k.mT`,
        `torch.transpose(k, -2, -1)`, or a local name bound to one of these."""
        if isinstance(expr, cst.Name):
            return self._transposed[-1].get(expr.value)
        if isinstance(expr, cst.Attribute) and expr.attr.value == "mT":
            return expr.value
        if not isinstance(expr, cst.Call) or has_splat(expr):
            return None
        args = [arg.value for arg in expr.args if arg.keyword is None]
        if len(args) != len(expr.args):
            return None
        if self.context.call_name(expr) == "torch.transpose" and len(args) == 3:
            return args[0] if _swaps_last_two(args[1], args[2]) else None
        called = method_call(expr)
        if called is not None and called[1] in ("transpose", "swapaxes", "swapdims") and len(args) == 2:
            if self.context.qualified_name(called[0]) is None and (
                _swaps_last_two(args[0], args[1]) or self._swaps_last_two_of_rank(called[0], args[0], args[1])
            ):
                return called[0]
        return None

    def _swaps_last_two_of_rank(self, tensor: cst.BaseExpression, first: cst.BaseExpression, second: cst.BaseExpression) -> bool:
        """`keys.transpose(2, 3)` where `keys` has 4 dimensions (what the code
        states, rules/_tensor_shapes.py): its last two."""
        rank = self._rank(tensor)
        if rank is None or not (isinstance(first, cst.Integer) and isinstance(second, cst.Integer)):
            return False
        return {int(first.value), int(second.value)} == {rank - 2, rank - 1}

    def _rank(self, expr: cst.BaseExpression) -> int | None:
        return self._shapes.rank(expr, self._lookup())

    def _lookup(self) -> Lookup:
        owner = self._owner()
        return Lookup(
            lambda call: self._local_callee(call, owner), owner, lambda: {c.name.value: c for c in self._index().classes}
        )

    def _product(self, expr: cst.BaseExpression, any_layout: bool = False) -> _QueryKey | None:
        """(q, k) for `q @ k^T`, `torch.matmul(q, k^T)`,
        `torch.einsum("bhid,bhjd->bhij", q, k)`."""
        if isinstance(expr, cst.Call) and self.context.call_name(expr) == "torch.einsum":
            if has_splat(expr) or len(expr.args) != 3 or any(arg.keyword for arg in expr.args):
                return None
            equation = string_value(expr.args[0].value)
            if equation is None:
                return None
            if _is_query_key_equation(equation, any_layout):
                return expr.args[1].value, expr.args[2].value
            if not _is_matrix_product(equation):
                return None
            # `einsum("bij,bjk->bik", q, k_t)` is `q @ k_t`.
            left, right = expr.args[1].value, expr.args[2].value
        else:
            operands = self._matmul_operands(expr)
            if operands is None:
                return None
            left, right = operands
        key = self._key_of_transposed(right)
        if key is not None:
            return left, key
        if any_layout and self._shapes.positions_by_positions(left, right, self._lookup()):
            # `torch.bmm(q, k)` of `(b, h*w, c)` by `(b, c, h*w)`: channels first.
            return left, right
        return None

    def _matmul_operands(self, expr: cst.BaseExpression) -> tuple[cst.BaseExpression, cst.BaseExpression] | None:
        """(a, b) for a matrix product written `a @ b`, `torch.matmul(a, b)` /
        `torch.bmm(a, b)`, or as the tensor method `a.matmul(b)` / `a.bmm(b)`."""
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.MatrixMultiply):
            return expr.left, expr.right
        if isinstance(expr, cst.Call) and self.context.call_name(expr) in _MATMUL:
            if has_splat(expr) or len(expr.args) != 2 or any(arg.keyword for arg in expr.args):
                return None
            return expr.args[0].value, expr.args[1].value
        called = method_call(expr)
        if called is not None and called[1] in _MATMUL_METHODS:
            if has_splat(expr) or len(expr.args) != 1 or expr.args[0].keyword is not None:
                return None
            if self.context.qualified_name(called[0]) is not None:
                return None  # `torch.matmul` itself, or another module's function
            return called[0], expr.args[0].value
        return None

    def _score_operands(self, expr: cst.BaseExpression) -> _QueryKey | None:
        """(q, k) when `expr` is a score matrix `q @ k^T`, scaled, masked or
        biased, directly or through a local name."""
        if isinstance(expr, cst.Name):
            return self._scores[-1].get(expr.value)
        product = self._product(expr, any_layout=True)
        if product is not None:
            return product
        if isinstance(expr, cst.BinaryOperation):
            operator = expr.operator
            if isinstance(operator, (cst.Multiply, cst.Add, cst.Subtract)):
                return self._score_operands(expr.left) or self._score_operands(expr.right)
            if isinstance(operator, cst.Divide):
                return self._score_operands(expr.left)
            return None
        called = method_call(expr)
        if called is not None and called[1] in _SCORE_PRESERVING_METHODS:
            if self.context.qualified_name(called[0]) is None:
                return self._score_operands(called[0])
        if isinstance(expr, cst.Call):
            passed = self._returned_argument(expr)
            if passed is not None:
                return self._score_operands(passed)
        return None

    def _returned_argument(self, call: cst.Call) -> cst.BaseExpression | None:
        """The argument a function of this file (or a method of the enclosing
        class) returns as its result: every `return` of its body returns that
        parameter, changed at most in place. `attn = add_rel_pos(attn, q, ...)`
        adds a positional bias to the scores and hands the same matrix back."""
        if has_splat(call):
            return None
        function = self._local_callee(call, self._owner())
        if function is None:
            return None
        returned = _returned_parameter(function)
        if returned is None:
            return None
        params = [param.name.value for param in function.params.params]
        if params and params[0] == "self" and isinstance(call.func, cst.Attribute):
            params = params[1:]
        return bound_arguments(call, params).get(returned)

    def _softmax_input(self, call: cst.Call) -> _Softmax | None:
        """The input of a softmax call, whether it runs over the last dimension,
        and whether it has no argument other than the input and the dim."""
        if has_splat(call):
            return None
        if self.context.call_name(call) in _SOFTMAX:
            source, dim = get_arg(call, "input", 0), get_arg(call, "dim", 1)
            if isinstance(source, cst.Arg) and isinstance(dim, cst.Arg):
                return _Softmax(source.value, self._is_last_dim(dim.value, source.value), len(call.args) == 2)
            return None
        module = dotted_name(call.func)
        if module is not None and self._softmax_modules.get(module):
            # `self.softmax = nn.Softmax(dim=-1)`, then `self.softmax(scores)`.
            if len(call.args) == 1 and call.args[0].keyword is None:
                return _Softmax(call.args[0].value, True, True)
            return None
        called = method_call(call)
        if called is None or called[1] != "softmax" or self.context.qualified_name(called[0]) is not None:
            return None
        dim = get_arg(call, "dim", 0)
        if not isinstance(dim, cst.Arg):
            return None
        return _Softmax(called[0], self._is_last_dim(dim.value, called[0]), len(call.args) == 1)

    def _is_last_dim(self, dim: cst.BaseExpression, tensor: cst.BaseExpression) -> bool:
        """`-1`, or `2` of a tensor whose three dimensions the code states."""
        if _is_minus(dim, 1):
            return True
        return isinstance(dim, cst.Integer) and self._rank(tensor) == int(dim.value) + 1

    def visit_Call(self, node: cst.Call) -> None:
        softmax = self._softmax_input(node)
        if softmax is None or not softmax.last_dim:
            return
        operands = self._score_operands(softmax.input)
        if operands is None or self._has_fused_path() or self._is_dispatched_fallback():
            return
        scope = self._scope()
        before = scope.position.get(id(self.context.tracker.current_statement))
        if before is None or not self._weights_meet_values(node, scope, before):
            return
        if self._not_sequence_by_sequence(*operands, scope, before):
            return
        self.report(
            node,
            "Attention by hand: softmax(q @ k^T) stores a sequence x sequence matrix per head",
            fix=self._fix(node, softmax.input) if softmax.input_and_dim_only else None,
        )

    # --- a fused path beside this one ----------------------------------------
    def _has_fused_path(self) -> bool:
        """Whether this code is one side of a choice whose other side calls a
        fused kernel: `if self.fused_attn: F.scaled_dot_product_attention(...)
        else: <here>`, an earlier `if flash: return ...` in the function, or
        `if needs_eager: <here>; return ...` followed by the fused call."""
        stack = self.context.tracker.statements
        function_at = next(
            (i for i in range(len(stack) - 1, -1, -1) if isinstance(stack[i], cst.FunctionDef)), -1
        )
        owner = (
            stack[function_at - 1]
            if function_at > 0 and isinstance(stack[function_at - 1], cst.ClassDef)
            else None
        )
        for index in range(function_at + 1, len(stack)):
            child = stack[index]
            parent = stack[index - 1] if index - 1 > function_at else None
            if isinstance(parent, cst.If):
                in_body = isinstance(parent.body, cst.IndentedBlock) and any(
                    s is child for s in parent.body.body
                )
                other = parent.orelse if in_body else parent.body
                if other is not None and self._calls_fused(other, owner):
                    return True
            block = enclosing_block(stack, self.context.module, child)
            if block is None:
                continue
            at = next(i for i, statement in enumerate(block) if statement is child)
            for earlier in block[:at]:
                if (
                    isinstance(earlier, cst.If)
                    and ends_in_exit(earlier.body)
                    and self._calls_fused(earlier.body, owner)
                ):
                    return True
            if (
                isinstance(child, cst.If)
                and index + 1 < len(stack)
                and ends_in_exit(child.body)
                and any(s is stack[index + 1] for s in statements_of(child.body))
                and any(self._calls_fused(later, owner) for later in block[at + 1 :])
            ):
                return True
        return False

    def _calls_fused(self, node: cst.CSTNode, owner: cst.ClassDef | None) -> bool:
        """Whether `node` calls a fused attention kernel, directly or through
        a method of `owner` or a function of this file that calls one."""
        for call in descendants(node):
            if not isinstance(call, cst.Call):
                continue
            if is_fused_kernel(self.context.call_name(call)):
                return True
            callee = self._local_callee(call, owner)
            if callee is not None and self._body_calls_fused(callee):
                return True
        return False

    def _local_callee(self, call: cst.Call, owner: cst.ClassDef | None) -> cst.FunctionDef | None:
        """The definition `self.m(...)` (a method of `owner`) or `f(...)` (a
        function of this module) runs."""
        func = call.func
        if isinstance(func, cst.Name):
            return self._index().functions.get(func.value) or self._nested_function(func.value)
        if (
            isinstance(func, cst.Attribute)
            and isinstance(func.value, cst.Name)
            and func.value.value == "self"
        ):
            return method_named(owner, func.attr.value) if owner is not None else None
        return None

    def _nested_function(self, name: str) -> cst.FunctionDef | None:
        """A function defined in the body of the function being read (`def
        shape(states): return states.view(...).transpose(1, 2)` inside a
        forward), the one of that name when it is defined once."""
        function = self.context.tracker.current_function
        if function is None or not isinstance(function.body, cst.IndentedBlock):
            return None
        found = [
            statement
            for statement in function.body.body
            if isinstance(statement, cst.FunctionDef) and statement.name.value == name
        ]
        return found[0] if len(found) == 1 else None

    def _body_calls_fused(self, function: cst.FunctionDef) -> bool:
        known = self._fused_bodies.get(id(function))
        if known is None:
            known = any(
                isinstance(call, cst.Call) and is_fused_kernel(self.context.call_name(call))
                for call in descendants(function)
            )
            self._fused_bodies[id(function)] = known
        return known

    # --- one implementation among several --------------------------------------
    def _is_dispatched_fallback(self) -> bool:
        """Whether the enclosing module-level function, or the class of the
        enclosing method, is one entry of a dispatch between implementations:
        the default of a registry lookup (`FUNCTIONS.get(config.impl, eager)`),
        a value of a dict that also names a fused implementation
        (`{"eager": Attention, "sdpa": SdpaAttention}`), or a class whose
        subclass overrides this method with one that calls a fused kernel."""
        stack = self.context.tracker.statements
        top = stack[0] if stack else None
        if isinstance(top, cst.FunctionDef):
            return self._may_be_dispatched(top.name.value) and top.name.value in self._dispatched(self._index())
        if isinstance(top, cst.ClassDef) and len(stack) > 1 and isinstance(stack[1], cst.FunctionDef):
            index = self._index()
            if self._may_be_dispatched(top.name.value) and top.name.value in self._dispatched(index):
                return True
            method = stack[1].name.value
            for subclass in index.classes:
                if not any(
                    isinstance(base.value, cst.Name) and base.value.value == top.name.value
                    for base in subclass.bases
                ):
                    continue
                override = method_named(subclass, method)
                if override is not None and self._calls_fused(override, subclass):
                    return True
        return False

    def _may_be_dispatched(self, name: str) -> bool:
        """A test on the text before the tree is walked for dispatches: the
        name written as a dict value (`: Name,` / `: Name}`) or as the last
        argument of a call (`.get(key, Name)`)."""
        escaped = re.escape(name)
        pattern = rf"[:]\s*{escaped}\s*[,}}]|,\s*{escaped}\s*,?\s*\)"
        return re.search(pattern, self.context.source) is not None

    def _index(self) -> FileIndex:
        if self._file_index is None:
            self._file_index = FileIndex(self.context.module)
        return self._file_index

    def _dispatched(self, index: FileIndex) -> frozenset[str]:
        if index.dispatched is None:
            index.dispatched = self._dispatched_names(index)
        return index.dispatched

    def _dispatched_names(self, index: FileIndex) -> frozenset[str]:
        names: set[str] = set()
        for node in descendants(index.module):
            node_type = type(node)
            if node_type is cst.Dict:
                values = [
                    element.value.value
                    for element in node.elements
                    if isinstance(element, cst.DictElement) and isinstance(element.value, cst.Name)
                ]
                if len(values) >= 2 and any(self._is_fused_implementation(value, index) for value in values):
                    names.update(values)
            elif node_type is cst.Call:
                called = method_call(node)
                positional = [arg.value for arg in node.args if arg.keyword is None and not arg.star]
                # `registry.get(key, default)`: the default is one of the implementations.
                is_lookup = called is not None and called[1].startswith("get") and len(positional) >= 2
                if is_lookup and isinstance(positional[-1], cst.Name):
                    names.add(positional[-1].value)
        return frozenset(names)

    def _is_fused_implementation(self, name: str, index: FileIndex) -> bool:
        function = index.functions.get(name)
        if function is not None:
            return self._body_calls_fused(function)
        owner = next((candidate for candidate in index.classes if candidate.name.value == name), None)
        return owner is not None and self._calls_fused(owner, owner)

    # --- the weights are applied to values ------------------------------------
    def _scope(self) -> Scope:
        owner = scope_of(self.context.tracker.current_function, self.context.module)
        scope = self._scopes.get(id(owner))
        if scope is None:
            scope = self._scopes[id(owner)] = Scope(owner)
        return scope

    def _weights_meet_values(self, softmax: cst.Call, scope: Scope, start: int) -> bool:
        """Whether the softmax, from its statement on, is multiplied with
        another tensor (`attn @ v`, an einsum), through dropout, casts and
        masks, or is bound to names nothing reads again (a matrix built for
        nothing). Weights only mixed, reduced or returned (an attention map
        for inspection) are not what the fused kernels replace."""
        weights: set[str] = set()
        # The names the softmax itself is bound to that nothing has read yet.
        unread: set[str] = set()
        for position, small in scope.lines:
            if position < start:
                continue
            if self._contracts_weights(small, weights, softmax):
                return True
            if position > start:
                unread -= names_read_by(small)
            elif isinstance(small, cst.Assign) and self._carries_weights(small.value, set(), softmax):
                unread = {
                    target.target.value for target in small.targets if isinstance(target.target, cst.Name)
                }
            if isinstance(small, (cst.Assign, cst.AnnAssign)) and small.value is not None:
                carries = self._carries_weights(small.value, weights, softmax)
                targets = (
                    [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
                )
                for target in targets:
                    if isinstance(target, cst.Name):
                        if carries:
                            weights.add(target.value)
                        else:
                            weights.discard(target.value)
        return bool(unread)

    def _contracts_weights(self, small: cst.CSTNode, weights: set[str], softmax: cst.Call) -> bool:
        for node in descendants(small):
            if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.MatrixMultiply):
                operands = [node.left, node.right]
            elif isinstance(node, cst.Call):
                qualified = self.context.call_name(node)
                called = method_call(node)
                if qualified in _MATMUL:
                    operands = [arg.value for arg in node.args]
                elif qualified == "torch.einsum":
                    operands = [arg.value for arg in node.args[1:]]
                elif called is not None and qualified is None and called[1] in ("matmul", "bmm"):
                    operands = [called[0], *(arg.value for arg in node.args)]
                else:
                    continue
            else:
                continue
            if any(self._carries_weights(operand, weights, softmax) for operand in operands):
                return True
        return False

    def _carries_weights(self, expr: cst.BaseExpression, weights: set[str], softmax: cst.Call) -> bool:
        if expr is softmax:
            return True
        if isinstance(expr, cst.Name):
            return expr.value in weights
        if isinstance(expr, cst.BinaryOperation):
            if isinstance(expr.operator, cst.MatrixMultiply):
                return False
            return self._carries_weights(expr.left, weights, softmax) or self._carries_weights(
                expr.right, weights, softmax
            )
        if isinstance(expr, cst.Subscript):
            return self._carries_weights(expr.value, weights, softmax)
        if isinstance(expr, cst.IfExp):
            return self._carries_weights(expr.body, weights, softmax) or self._carries_weights(
                expr.orelse, weights, softmax
            )
        if not isinstance(expr, cst.Call):
            return False
        called = method_call(expr)
        if called is not None and self._carries_weights(called[0], weights, softmax):
            return called[1] in WEIGHT_PRESERVING_METHODS
        qualified = self.context.call_name(expr)
        if qualified is not None and qualified not in WEIGHT_PRESERVING_FUNCTIONS:
            return False
        # `self.attn_drop(attn)`, `dropout(attn, p)`: a module or function of
        # the weights gives weights.
        return any(
            self._carries_weights(arg.value, weights, softmax) for arg in expr.args if arg.keyword is None
        )

    # --- not sequence x sequence ----------------------------------------------
    def _not_sequence_by_sequence(
        self, query: cst.BaseExpression, key: cst.BaseExpression, scope: Scope, before: int
    ) -> bool:
        """Whether the code says the score matrix is not (tokens x tokens):
        a learned set of queries or keys (`self.latents`), queries taken at
        fixed positions (`x[:, :1]`, one block `q_blocks[:, :, 0]`), tokens
        regrouped into windows, pooled (`.mean(dim=-2)`, landmarks) or
        unfolded into local neighbourhoods, or the tokens moved to the
        contracted axis (channel attention, `d x d` scores)."""
        if self._is_learned(query, scope, before) or self._is_learned(key, scope, before):
            return True
        query_lineage = scope.lineage(query, before)
        key_lineage = scope.lineage(key, before)
        if self._selects_fixed_positions(query_lineage, key_lineage) or self._resamples_latents(
            query_lineage, key_lineage
        ):
            return True
        return any(
            isinstance(node, cst.Call) and self._reshapes_tokens(node)
            for expr in (*query_lineage, *key_lineage)
            for node in descendants(expr)
        )

    def _is_learned(self, expr: cst.BaseExpression, scope: Scope, before: int) -> bool:
        """`self.queries` (a parameter, not computed from the input), through
        broadcasts and casts (`.expand(b, -1, -1)`, einops `repeat`) and local
        names bound only to such values."""
        while True:
            if isinstance(expr, cst.Attribute):
                name = dotted_name(expr)
                return name is not None and name.startswith("self.")
            called = method_call(expr)
            if (
                called is not None
                and called[1] in BROADCAST_METHODS
                and self.context.qualified_name(called[0]) is None
            ):
                expr = called[0]
                continue
            if isinstance(expr, cst.Call) and self.context.call_name(expr) == "einops.repeat" and expr.args:
                expr = expr.args[0].value
                continue
            if isinstance(expr, cst.Name):
                bound = [
                    (position, value)
                    for position, value in scope.bindings.get(expr.value, ())
                    if position < before
                ]
                return bool(bound) and all(
                    self._is_learned(value, scope, position) for position, value in bound
                )
            return False

    def _selects_fixed_positions(
        self, query_lineage: list[cst.BaseExpression], key_lineage: list[cst.BaseExpression]
    ) -> bool:
        """The queries come from a fixed number of positions of a tensor the
        keys do not come from: `self.q(x[:, :1])` (a class token), `blocks[:, :, 0]`
        (one block). A packed `qkv[:, :, 0]` / `qkv[:, :, 1]` is a split, not a
        selection: the keys come from the same tensor."""
        key_sources = {
            self.context.code_for(node.value)
            for expr in key_lineage
            for node in descendants(expr)
            if isinstance(node, cst.Subscript)
        }
        return any(
            isinstance(node, cst.Subscript)
            and selects_fixed_length(node)
            and self.context.code_for(node.value) not in key_sources
            for expr in query_lineage
            for node in descendants(expr)
        )

    def _resamples_latents(
        self, query_lineage: list[cst.BaseExpression], key_lineage: list[cst.BaseExpression]
    ) -> bool:
        """A Perceiver / Flamingo resampler: the queries are the latents
        (`q = to_q(latents)`) and the keys the input with the latents
        concatenated (`k = to_k(torch.cat([x, latents], dim=-2))`), so the
        scores are (latents x tokens), linear in the tokens. Only the name
        tells latents from the tokens of ordinary cross-attention, so both
        halves of the shape are required."""
        latents = {
            name for expr in query_lineage for name in names_read(expr) if "latent" in name.lower()
        }
        if not latents:
            return False
        for expr in key_lineage:
            for node in descendants(expr):
                if not isinstance(node, cst.Call) or self.context.call_name(node) not in _CONCATENATE:
                    continue
                pieces = node.args[0].value if node.args else None
                if isinstance(pieces, (cst.List, cst.Tuple)) and len(pieces.elements) >= 2:
                    if any(dotted_name(element.value) in latents for element in pieces.elements):
                        return True
        return False

    def _reshapes_tokens(self, call: cst.Call) -> bool:
        qualified = self.context.call_name(call)
        if qualified == "einops.rearrange":
            pattern = get_arg(call, "pattern", 1)
            text = string_value(pattern.value) if isinstance(pattern, cst.Arg) else None
            return text is not None and (folds_windows_into_batch(text) or moves_tokens_last(text))
        if qualified == "torch.nn.functional.unfold":
            return True
        if qualified == "torch.mean":
            return pools_positions(get_arg(call, "dim", 1))
        called = method_call(call)
        if called is None or qualified is not None:
            return False
        receiver, method = called
        if method == "unfold":
            # Tensor.unfold(dim, size, step): sliding windows.
            return len(call.args) == 3
        if method == "mean":
            return pools_positions(get_arg(call, "dim", 0))
        if method == "permute":
            return permutes_tokens_last(call, receiver)
        return False

    # --- the fix --------------------------------------------------------------
    def _fix(self, softmax: cst.Call, source: cst.BaseExpression) -> FixSpec | None:
        tracker = self.context.tracker
        statement = tracker.current_statement
        weights = single_assignment(statement)
        if weights is None or weights.value is not softmax:
            return None
        if not isinstance(weights.targets[0].target, cst.Name):
            return None
        block = enclosing_block(tracker.statements, self.context.module, statement)
        if block is None:
            return None
        statements = list(block)
        index = next(i for i, candidate in enumerate(statements) if candidate is statement)
        if index + 1 >= len(statements):
            return None
        scope = scope_of(tracker.current_function, self.context.module)
        removed: list[cst.SimpleStatementLine] = [statement]  # type: ignore[list-item]
        if isinstance(source, cst.Name):
            previous = single_assignment(statements[index - 1]) if index > 0 else None
            if (
                previous is None
                or dotted_name(previous.targets[0].target) != source.value
                or len(references(scope, source.value)) != 2
            ):
                return None
            removed.insert(0, statements[index - 1])  # type: ignore[arg-type]
            source = previous.value
        weights_name = weights.targets[0].target.value  # type: ignore[attr-defined]
        if len(references(scope, weights_name)) != 2:
            return None
        output = _output_expression(statements[index + 1])
        value = self._times_value(output, weights_name) if output is not None else None
        parsed = self._scaled_product(source)
        if value is None or parsed is None:
            return None
        query, key, scale = parsed
        names = [dotted_name(query), dotted_name(key), dotted_name(value)]
        if None in names:
            return None
        functional = self.context.imports.reference_to("torch.nn.functional")
        return FixSpec(
            title="Use `scaled_dot_product_attention`",
            edits=fused_attention(
                functional=functional or "torch.nn.functional",
                query=names[0],  # type: ignore[arg-type]
                key=names[1],  # type: ignore[arg-type]
                value=names[2],  # type: ignore[arg-type]
                scale=scale,
                removed=tuple(removed),
                output=output,  # type: ignore[arg-type]
            ),
            applicability=Applicability.SAFE,
            imports=() if functional else ("torch.nn.functional",),
        )

    def _times_value(self, expr: cst.BaseExpression, weights: str) -> cst.BaseExpression | None:
        """`v` for `weights @ v` / `torch.matmul(weights, v)` / `weights.matmul(v)`."""
        operands = self._matmul_operands(expr)
        if operands is None:
            return None
        left, right = operands
        if not (isinstance(left, cst.Name) and left.value == weights) or left.lpar or expr.lpar:
            return None
        return right

    def _scaled_product(self, expr: cst.BaseExpression) -> _ScaledProduct | None:
        """(q, k, code of `scale=`) when `expr` is `q @ k^T` times a scale
        provably equal to the kernel's (None), or a float."""
        product = self._product(expr)
        if product is not None:
            return (*product, "1.0")
        if not isinstance(expr, cst.BinaryOperation):
            return None
        if isinstance(expr.operator, cst.Divide):
            product = self._product(expr.left)
            if product is None:
                return None
            divisor = expr.right
            if self._is_sqrt_of_head_dim(divisor, product):
                return (*product, None)
            if self._is_float(divisor):
                return (*product, f"1 / {self.context.code_for(divisor)}")
            return None
        if not isinstance(expr.operator, cst.Multiply):
            return None
        for factor, product_side in ((expr.right, expr.left), (expr.left, expr.right)):
            product = self._product(product_side)
            if product is None:
                continue
            if self._is_inverse_sqrt_of_head_dim(factor, product):
                return (*product, None)
            if self._is_float(factor):
                return (*product, self.context.code_for(factor))
            return None
        return None

    def _is_head_dim(self, expr: cst.BaseExpression, product: _QueryKey) -> bool:
        """`q.size(-1)` or `q.shape[-1]` (or k's: q and k share the last dimension)."""
        operands = {dotted_name(product[0]), dotted_name(product[1])} - {None}
        called = method_call(expr)
        if called is not None and called[1] == "size" and isinstance(expr, cst.Call) and len(expr.args) == 1:
            return dotted_name(called[0]) in operands and _is_minus(expr.args[0].value, 1)
        if not (isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Attribute)):
            return False
        index = expr.slice[0].slice if len(expr.slice) == 1 else None
        return (
            expr.value.attr.value == "shape"
            and dotted_name(expr.value.value) in operands
            and isinstance(index, cst.Index)
            and _is_minus(index.value, 1)
        )

    def _is_sqrt_of_head_dim(self, expr: cst.BaseExpression, product: _QueryKey) -> bool:
        """`math.sqrt(q.size(-1))`, `q.shape[-1] ** 0.5`."""
        if isinstance(expr, cst.Call) and self.context.call_name(expr) == "math.sqrt" and len(expr.args) == 1:
            return self._is_head_dim(expr.args[0].value, product)
        base = _power_base(expr, "0.5")
        return base is not None and self._is_head_dim(base, product)

    def _is_inverse_sqrt_of_head_dim(self, expr: cst.BaseExpression, product: _QueryKey) -> bool:
        """`q.size(-1) ** -0.5`, `1 / math.sqrt(q.size(-1))`, `1.0 / q.shape[-1] ** 0.5`."""
        if (
            isinstance(expr, cst.BinaryOperation)
            and isinstance(expr.operator, cst.Divide)
            and isinstance(expr.left, (cst.Integer, cst.Float))
            and expr.left.value in ("1", "1.0")
        ):
            return self._is_sqrt_of_head_dim(expr.right, product)
        base = _power_base(expr, "-0.5")
        return base is not None and self._is_head_dim(base, product)

    def _is_float(self, expr: cst.BaseExpression) -> bool:
        """A Python number whatever the names in it hold: a literal, `math.sqrt(...)`,
        `1 / math.sqrt(...)`, or a literal raised to a literal power."""
        if _is_number(expr):
            return True
        if isinstance(expr, cst.Call):
            return self.context.call_name(expr) == "math.sqrt"
        if isinstance(expr, cst.BinaryOperation):
            arithmetic = isinstance(expr.operator, (cst.Divide, cst.Power, cst.Multiply))
            return arithmetic and self._is_float(expr.left) and self._is_float(expr.right)
        if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
            return self._is_float(expr.expression)
        return False


def _returned_parameter(function: cst.FunctionDef) -> str | None:
    """The parameter every `return` of the function returns (not counting
    nested functions), or None: several, none, or anything else returned."""
    params = {param.name.value for param in function.params.params}
    returned: set[str] = set()
    pending: list[cst.CSTNode] = [function.body]
    while pending:
        node = pending.pop()
        if isinstance(node, (cst.FunctionDef, cst.Lambda, cst.ClassDef)):
            continue
        if isinstance(node, cst.Return):
            if not isinstance(node.value, cst.Name) or node.value.value not in params:
                return None
            returned.add(node.value.value)
            continue
        pending.extend(children(node))
    if len(returned) != 1:
        return None
    (name,) = returned
    # Rebound in the body to anything but the same matrix changed elementwise
    # or reshaped: what it returns is no longer the argument.
    for node in descendants(function.body):
        if isinstance(node, (cst.Assign, cst.AugAssign, cst.AnnAssign)):
            targets = [t.target for t in node.targets] if isinstance(node, cst.Assign) else [node.target]
            if not any(isinstance(target, cst.Name) and target.value == name for target in targets):
                continue
            if isinstance(node, cst.AugAssign):
                continue  # `attn += bias`
            if node.value is None or not _elementwise_of(node.value, name):
                return None
    return name


_ELEMENTWISE_OPERATORS = (cst.Add, cst.Subtract, cst.Multiply, cst.Divide)
_RESHAPING_METHODS = frozenset({"view", "reshape", "masked_fill", "float", "to", "type_as", "contiguous"})


def _elementwise_of(value: cst.BaseExpression, name: str) -> bool:
    """`(attn.view(B, h, w, h, w) + rel_h + rel_w).view(B, h * w, h * w)`: the
    value `name` holds, changed elementwise and reshaped."""
    if isinstance(value, cst.Name):
        return value.value == name
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, _ELEMENTWISE_OPERATORS):
        return _elementwise_of(value.left, name) or (
            not isinstance(value.operator, cst.Divide) and _elementwise_of(value.right, name)
        )
    called = method_call(value)
    return called is not None and called[1] in _RESHAPING_METHODS and _elementwise_of(called[0], name)


def _output_expression(statement: cst.CSTNode) -> cst.BaseExpression | None:
    """The value of `target = value` or `return value`, alone on its line."""
    if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
        return None
    small = statement.body[0]
    if isinstance(small, cst.Assign) and len(small.targets) == 1:
        return small.value
    if isinstance(small, cst.Return):
        return small.value
    return None
