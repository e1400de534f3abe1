"""OOM502: remove a `torch.cuda.empty_cache()` statement."""

from __future__ import annotations

import libcst as cst

from oom_lsp.edits import DeleteStatement, NodeEdit, Replace


def remove_call_statement(
    statement: cst.SimpleStatementLine, call_expression: cst.Expr, *, only_statement_of_block: bool
) -> tuple[NodeEdit, ...]:
    """Delete the statement's line, or leave `pass` where a block would
    otherwise be empty (its comments stay)."""
    if only_statement_of_block:
        return (Replace(call_expression, "pass"),)
    return (DeleteStatement(statement),)
