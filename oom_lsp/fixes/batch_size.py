"""OOM101: lower a literal batch size to the configured limit."""

from __future__ import annotations

import libcst as cst

from oom_lsp.edits import NodeEdit, Replace


def lower_batch_size(literal: cst.Integer, limit: int) -> tuple[NodeEdit, ...]:
    """Replace the literal with the limit; the rest of the line is untouched."""
    return (Replace(literal, str(limit)),)
