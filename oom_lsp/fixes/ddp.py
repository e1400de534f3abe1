"""OOM603: pass `gradient_as_bucket_view=True` to `DistributedDataParallel`."""

from __future__ import annotations

import libcst as cst

from oom_lsp.edits import InsertAfter, NodeEdit


def add_gradient_as_bucket_view(call: cst.Call) -> tuple[NodeEdit, ...]:
    """Add the keyword after the last argument, keeping the call's layout."""
    return (InsertAfter(call.args[-1].value, ", gradient_as_bucket_view=True"),)
