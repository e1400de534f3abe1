"""A notebook's script on disk for the time of a run (`oom-lsp estimate`).

The script is written next to the notebook, as a hidden file removed when the
run ends: the run then sees what the kernel saw (the notebook's folder first
on `sys.path`, so its own modules import, and counted as the user's code when
frames are attributed), and the run's working folder is the notebook's, as a
Jupyter kernel's is.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oom_lsp.notebooks.document import NotebookError, decode_notebook_bytes
from oom_lsp.notebooks.script import NotebookScript, ScriptPlaces, build_script


@dataclass(frozen=True)
class NotebookRun:
    script: Path  # the hidden script to run
    cwd: Path  # the notebook's folder
    notebook: Path  # as the user named it
    places: ScriptPlaces
    built: NotebookScript

    def report(self, report: dict[str, Any]) -> dict[str, Any]:
        """A run's JSON report with the script's places named as cells, the notebook
        as its script, and which cells ran and what was not run."""
        named = self.places.report(report)
        named["script"] = self.places.notebook_path
        named["notebook"] = {
            "cells_run": [cell.number for cell in self.built.cells],
            "not_run": [
                {"cell": skipped.cell, "line": skipped.line, "code": skipped.code}
                for skipped in self.built.skipped
            ],
        }
        return named


@contextmanager
def notebook_as_script(notebook: Path, display: str | None = None) -> Iterator[NotebookRun]:
    """Raises NotebookError (one line) when the file is no notebook the script can
    run, or its folder cannot take the script."""
    try:
        raw = notebook.read_bytes()
    except OSError as error:
        raise NotebookError(f"cannot read it: {error.strerror or error}") from None
    text, _ = decode_notebook_bytes(raw)
    built = build_script(text)
    folder = notebook.resolve().parent
    try:
        handle, name = tempfile.mkstemp(prefix=f".{notebook.stem}.oom-lsp-", suffix=".py", dir=folder)
    except OSError as error:
        raise NotebookError(
            f"cannot write its script next to it in {folder}: {error.strerror or error}"
        ) from None
    script = Path(name)
    try:
        with os.fdopen(handle, "w", encoding="utf-8", newline="") as file:
            file.write(built.text)
        names = {str(script), script.name}
        try:
            names.add(os.path.relpath(script))
        except ValueError:  # another drive (Windows)
            pass
        places = ScriptPlaces(built, names, display or str(notebook), str(notebook.resolve()))
        yield NotebookRun(script, folder, notebook, places, built)
    finally:
        script.unlink(missing_ok=True)
