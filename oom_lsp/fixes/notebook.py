"""Fixes of the notebook rules (OOM701-OOM703).

`FREE_FAILED_CELL` is the cleanup OOM701 inserts at the top of a training
cell. It is the one `bench/ipython_oom_references.py` runs in real IPython
kernels: after an out-of-memory error, `%xmode Minimal`, `gc.collect()`,
`torch.cuda.empty_cache()`, `sys.last_traceback = None` and
`traceback.clear_frames(...)` each left the failed step's tensors alive
(IPython 9.18, CPython 3.11: once IPython has shown a traceback, each frame's
locals live on in a dict that `frame.clear()` does not release); clearing
those dicts, then the frames, frees them.
"""

from __future__ import annotations

import libcst as cst

from oom_lsp.edits import InsertLinesBefore, NodeEdit

FREE_FAILED_CELL: tuple[str, ...] = (
    "import gc, sys, traceback",
    "",
    "",
    "def free_failed_cell():",
    '    """Free the tensors a failed run of a cell left: IPython keeps its traceback,',
    '    and the frames in it keep the locals of the step that failed."""',
    '    error = getattr(sys, "last_value", None)',
    "    while error is not None:",
    "        for frame, _ in traceback.walk_tb(error.__traceback__):",
    "            if frame.f_locals is not frame.f_globals:  # never the notebook's own names",
    "                frame.f_locals.clear()",
    "        traceback.clear_frames(error.__traceback__)",
    "        error = error.__cause__ or error.__context__",
    "    gc.collect()",
    "",
    "",
    "free_failed_cell()",
)


def free_failed_cell(statement: cst.CSTNode) -> tuple[NodeEdit, ...]:
    """Run the cleanup before the cell's training statement."""
    return (InsertLinesBefore(statement, FREE_FAILED_CELL),)


def release_before_rebuild(statement: cst.CSTNode, names: list[str]) -> tuple[NodeEdit, ...]:
    """`model = optimizer = None` before the statement that builds the new model,
    so the old one is freed before the new one takes its room."""
    line = " = ".join(names) + " = None  # free the previous run's before building new ones"
    return (InsertLinesBefore(statement, (line,)),)
