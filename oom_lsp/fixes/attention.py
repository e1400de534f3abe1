"""OOM402: replace a materialised softmax(q k^T) v by the fused kernel."""

from __future__ import annotations

import libcst as cst

from oom_lsp.edits import DeleteStatement, NodeEdit, Replace


def fused_attention(
    *,
    functional: str,
    query: str,
    key: str,
    value: str,
    scale: str | None,
    removed: tuple[cst.SimpleStatementLine, ...],
    output: cst.BaseExpression,
) -> tuple[NodeEdit, ...]:
    """Delete the statements that built the scores and their softmax, and
    compute `output` with `scaled_dot_product_attention` instead.

    `functional` is how the file spells `torch.nn.functional`; `scale` the
    code of the `scale=` value, None for the kernel's default 1/sqrt(E).
    """
    scale_argument = f", scale={scale}" if scale is not None else ""
    call = f"{functional}.scaled_dot_product_attention({query}, {key}, {value}{scale_argument})"
    return (*(DeleteStatement(statement) for statement in removed), Replace(output, call))
