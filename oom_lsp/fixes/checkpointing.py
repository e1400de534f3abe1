"""OOM601: enable gradient checkpointing on a Hugging Face model."""

from __future__ import annotations

import libcst as cst

from oom_lsp.edits import InsertLinesAfter, NodeEdit


def enable_gradient_checkpointing(statement: cst.SimpleStatementLine, model: str) -> tuple[NodeEdit, ...]:
    """`model.gradient_checkpointing_enable()` on the line after the
    statement that loads `model`."""
    return (InsertLinesAfter(statement, (f"{model}.gradient_checkpointing_enable()",)),)
