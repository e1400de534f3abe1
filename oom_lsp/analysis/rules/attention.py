"""OOM402: attention that materialises the full score matrix."""

from __future__ import annotations

from typing import NamedTuple

import libcst as cst

from oom_lsp.analysis.context import dotted_name
from oom_lsp.analysis.cst_helpers import get_arg, has_splat, method_call, string_value
from oom_lsp.analysis.findings import Applicability
from oom_lsp.analysis.registry import register
from oom_lsp.analysis.rule import FixSpec, Invalid, Rule, Valid
from oom_lsp.analysis.rules._scan import (
    descendants,
    enclosing_block,
    references,
    scope_of,
    single_assignment,
)
from oom_lsp.fixes.attention import fused_attention

_SOFTMAX = {"torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"}
_MATMUL = {"torch.matmul", "torch.bmm"}
# Operations that keep a score matrix a score matrix (masking, casting).
_SCORE_PRESERVING_METHODS = {"masked_fill", "masked_fill_", "float", "to", "type_as", "contiguous"}


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


def _is_query_key_equation(equation: str) -> bool:
    """`bhid,bhjd->bhij` (or `...id,...jd->...ij`): q @ k^T over the last two
    dimensions, the leading ones shared."""
    spec = equation.replace(" ", "")
    inputs, arrow, output = spec.partition("->")
    operands = inputs.split(",")
    if not arrow or len(operands) != 2:
        return False
    query, key = operands
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


def _is_number(expr: cst.BaseExpression) -> bool:
    return isinstance(expr, (cst.Integer, cst.Float))


@register
class NaiveAttention(Rule):
    """
    ## What it does
    Flags attention computed by hand: a softmax over the last dimension of
    `q @ k.transpose(-2, -1)` (or `k.mT`, `torch.matmul`, an einsum such as
    `"bhid,bhjd->bhij"`), scaled, masked or
    not, directly or through a variable (`scores = q @ k.mT / d ** 0.5`, then
    `scores.softmax(-1)`), with `torch.softmax`, `F.softmax`, `.softmax()` or
    an `nn.Softmax(dim=-1)` module.

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
    ]

    def __init__(self, context) -> None:  # type: ignore[no-untyped-def]
        super().__init__(context)
        # Per function: the local names currently holding a score matrix.
        self._scores: list[set[str]] = [set()]
        # Names and attributes bound to `nn.Softmax(dim=-1)` (False once bound
        # to anything else).
        self._softmax_modules: dict[str, bool] = {}

    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self._scores.append(set())

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._scores.pop()

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
        is_score = self._is_scores(value)
        for target in targets:
            if isinstance(target, cst.Name):
                names.discard(target.value)
                if is_score:
                    names.add(target.value)
                continue
            for node in descendants(target):
                if isinstance(node, cst.Name):
                    names.discard(node.value)

    # --- recognising the score matrix --------------------------------------
    def _key_of_transposed(self, expr: cst.BaseExpression) -> cst.BaseExpression | None:
        """`k` for `k.transpose(-2, -1)`, `k.transpose(-1, -2)`, `k.mT`,
        `torch.transpose(k, -2, -1)`."""
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
            if self.context.qualified_name(called[0]) is None and _swaps_last_two(args[0], args[1]):
                return called[0]
        return None

    def _product(self, expr: cst.BaseExpression) -> _QueryKey | None:
        """(q, k) for `q @ k^T`, `torch.matmul(q, k^T)`,
        `torch.einsum("bhid,bhjd->bhij", q, k)`."""
        if isinstance(expr, cst.Call) and self.context.call_name(expr) == "torch.einsum":
            if has_splat(expr) or len(expr.args) != 3 or any(arg.keyword for arg in expr.args):
                return None
            equation = string_value(expr.args[0].value)
            if equation is None or not _is_query_key_equation(equation):
                return None
            return expr.args[1].value, expr.args[2].value
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.MatrixMultiply):
            left, right = expr.left, expr.right
        elif isinstance(expr, cst.Call) and self.context.call_name(expr) in _MATMUL:
            if has_splat(expr) or len(expr.args) != 2 or any(arg.keyword for arg in expr.args):
                return None
            left, right = expr.args[0].value, expr.args[1].value
        else:
            return None
        key = self._key_of_transposed(right)
        return (left, key) if key is not None else None

    def _is_scores(self, expr: cst.BaseExpression) -> bool:
        if isinstance(expr, cst.Name):
            return expr.value in self._scores[-1]
        if self._product(expr) is not None:
            return True
        if isinstance(expr, cst.BinaryOperation):
            operator = expr.operator
            if isinstance(operator, (cst.Multiply, cst.Add, cst.Subtract)):
                return self._is_scores(expr.left) or self._is_scores(expr.right)
            if isinstance(operator, cst.Divide):
                return self._is_scores(expr.left)
            return False
        called = method_call(expr)
        if called is not None and called[1] in _SCORE_PRESERVING_METHODS:
            return self.context.qualified_name(called[0]) is None and self._is_scores(called[0])
        return False

    def _softmax_input(self, call: cst.Call) -> _Softmax | None:
        """The input of a softmax call, whether it runs over the last dimension,
        and whether it has no argument other than the input and the dim."""
        if has_splat(call):
            return None
        if self.context.call_name(call) in _SOFTMAX:
            source, dim = get_arg(call, "input", 0), get_arg(call, "dim", 1)
            if isinstance(source, cst.Arg) and isinstance(dim, cst.Arg):
                return _Softmax(source.value, _is_minus(dim.value, 1), len(call.args) == 2)
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
        return _Softmax(called[0], _is_minus(dim.value, 1), len(call.args) == 1)

    def visit_Call(self, node: cst.Call) -> None:
        softmax = self._softmax_input(node)
        if softmax is None or not softmax.last_dim or not self._is_scores(softmax.input):
            return
        self.report(
            node,
            "This softmax over `q @ k^T` materialises the whole sequence x sequence score matrix per "
            "head, and autograd keeps it and its softmax until backward: memory grows with the square "
            "of the sequence length. Use `torch.nn.functional.scaled_dot_product_attention`, whose "
            "fused kernels never store it.",
            fix=self._fix(node, softmax.input) if softmax.input_and_dim_only else None,
        )

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
        """`v` for `weights @ v` / `torch.matmul(weights, v)`."""
        if isinstance(expr, cst.BinaryOperation) and isinstance(expr.operator, cst.MatrixMultiply):
            left, right = expr.left, expr.right
        elif isinstance(expr, cst.Call) and self.context.call_name(expr) in _MATMUL:
            if has_splat(expr) or len(expr.args) != 2 or any(arg.keyword for arg in expr.args):
                return None
            left, right = expr.args[0].value, expr.args[1].value
        else:
            return None
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
