"""Jupyter notebooks (`.ipynb`): reading and writing the file, IPython's
magics, and the analysis of the code cells as one program.

- `document`: the nbformat 4 JSON, read with the position of every cell's
  source so a fix rewrites those characters only (outputs, metadata, cell ids,
  key order and indentation stay byte for byte).
- `magics`: IPython's escapes (`%`, `!`, `?`, `%%`) turned into Python of the
  same line lengths, or the cell skipped when it is not Python at all.
- `program`: the code cells joined in document order (the order of "Run
  All"), analysed by the same engine as a `.py` file, findings mapped back to
  their cells; `--fix` applied cell by cell.

Nothing here imports pygls, lsprotocol or torch; `document` and `magics` do not
import libcst either.
"""

from __future__ import annotations

NOTEBOOK_SUFFIX = ".ipynb"


def is_notebook_path(path: str) -> bool:
    return path.lower().endswith(NOTEBOOK_SUFFIX)
