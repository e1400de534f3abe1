"""Reading an .ipynb with each cell's source span, and writing back only the
cells a fix changed: every other byte of the file stays as it was."""

from __future__ import annotations

import json

import nbformat
import pytest

from oom_lsp.notebooks.document import NotebookError, decode_notebook_bytes, read_notebook
from tests.notebooks import shapes


@pytest.mark.parametrize("writer", list(shapes.WRITERS))
def test_cells_are_read_as_json_says(writer: str) -> None:
    text = shapes.WRITERS[writer](shapes.notebook())
    notebook = read_notebook(text)
    expected = json.loads(text)["cells"]
    assert [cell.cell_type for cell in notebook.cells] == [cell["cell_type"] for cell in expected]
    assert [cell.source for cell in notebook.cells] == ["".join(cell["source"]) for cell in expected]
    assert [cell.number for cell in notebook.code_cells()] == [2, 3, 4, 6]


@pytest.mark.parametrize("writer", list(shapes.WRITERS))
def test_rewriting_one_cell_changes_only_its_source(writer: str) -> None:
    text = shapes.WRITERS[writer](shapes.notebook())
    notebook = read_notebook(text)
    train = notebook.cells[3]
    new_source = train.source.replace("total_loss += loss", "total_loss += loss.item()  # ✓")
    written = notebook.with_sources({train.index: new_source})
    # Outside the cell's `source` value, byte for byte.
    assert written[: train.source_start] == text[: train.source_start]
    assert written.endswith(text[train.source_end :])
    # What a reader of the file gets back: only that cell's source changed.
    before, after = json.loads(text), json.loads(written)
    after["cells"][3]["source"] = before["cells"][3]["source"]
    assert after == before
    assert "".join(json.loads(written)["cells"][3]["source"]) == new_source
    nbformat.validate(nbformat.reads(written, as_version=4))


def test_a_rewritten_list_source_is_laid_out_as_jupyter_writes_it() -> None:
    nb = shapes.notebook()
    text = shapes.jupyter(nb)
    notebook = read_notebook(text)
    cell = notebook.cells[5]
    written = notebook.with_sources({cell.index: cell.source.replace("'x.pt'", "'x.pt', map_location='cpu'")})
    nb["cells"][5]["source"] = shapes._lines(json.loads(written)["cells"][5]["source"][0] + "model.load_state_dict(ckpt)")
    assert written == shapes.jupyter(nb)


def test_nothing_changed_writes_the_same_text() -> None:
    text = shapes.vscode(shapes.notebook())
    notebook = read_notebook(text)
    assert notebook.with_sources({cell.index: cell.source for cell in notebook.cells}) == text


def test_file_positions_point_at_the_code_in_the_json() -> None:
    text = shapes.jupyter(shapes.notebook())
    notebook = read_notebook(text)
    cell = notebook.cells[3]
    line, column = notebook.file_position(cell, 9, 4)  # `total_loss += loss`, 0-based column 4
    assert text.splitlines()[line - 1][column:].startswith("total_loss += loss")
    cell = notebook.cells[5]
    line, column = notebook.file_position(cell, 1, 7)  # after "résumé" escapes nothing in raw text
    assert text.splitlines()[line - 1][column:].startswith("torch.load")
    escaped = shapes.escaped(shapes.notebook())
    notebook = read_notebook(escaped)
    markdown = notebook.cells[0]
    line, column = notebook.file_position(markdown, 1, 11)  # the ✓ written as \u2713
    assert escaped.splitlines()[line - 1][column:].startswith("\\u2713")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"cells": [', "not a notebook: invalid JSON: Expecting value at line 1, column 12"),
        ("[1, 2]", "not a notebook: the file holds a JSON array, not an object"),
        ('{"nbformat": 3, "worksheets": []}', "nbformat 3 is not supported, only nbformat 4 (convert it with"),
        ('{"cells": []}', 'not a notebook: no "nbformat" version'),
        ('{"nbformat": 4}', 'not a notebook: no "cells" list'),
        ('{"nbformat": 4, "cells": [{"cell_type": "code", "source": 3}]}', "not a notebook: the source of cell 1 is neither"),
        ('{"nbformat": 4, "cells": [{"cell_type": "code"}]}', 'not a notebook: cell 1 has no "source"'),
    ],
)
def test_what_is_not_a_notebook_is_one_line(text: str, message: str) -> None:
    with pytest.raises(NotebookError) as raised:
        read_notebook(text)
    assert str(raised.value).startswith(message)
    assert "\n" not in str(raised.value)


def test_bytes_are_utf8_with_an_optional_bom() -> None:
    assert decode_notebook_bytes(b"\xef\xbb\xbf{}") == ("{}", True)
    with pytest.raises(NotebookError, match="not UTF-8"):
        decode_notebook_bytes(b'{"a": "\xe9"}')


def test_a_notebook_of_another_language_has_no_code_cells() -> None:
    nb = shapes.notebook()
    nb["metadata"]["kernelspec"]["language"] = "R"
    nb["metadata"]["language_info"]["name"] = "R"
    assert read_notebook(shapes.jupyter(nb)).code_cells() == []
    nb = shapes.notebook()
    nb["cells"][1]["metadata"]["vscode"] = {"languageId": "sql"}
    assert [cell.number for cell in read_notebook(shapes.jupyter(nb)).code_cells()] == [3, 4, 6]
