"""A notebook as a script (oom_lsp.notebooks.script): escapes made inert with
every line kept in place, what is not run listed by cell and line, cells that
cannot run refused in one line, and the script's places named as cells."""

from __future__ import annotations

import json

import pytest

from oom_lsp.notebooks.document import NotebookError
from oom_lsp.notebooks.script import ScriptPlaces, build_script


def _notebook(*cells: tuple[str, str]) -> str:
    return json.dumps(
        {
            "cells": [
                {"cell_type": kind, "metadata": {}, "source": source, "outputs": [], "execution_count": None}
                if kind == "code"
                else {"cell_type": kind, "metadata": {}, "source": source}
                for kind, source in cells
            ],
            "metadata": {"kernelspec": {"name": "python3", "language": "python", "display_name": "Python 3"}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


def test_escapes_become_none_and_lines_stay_in_their_cells() -> None:
    script = build_script(
        _notebook(
            ("markdown", "# Title"),
            ("code", "%matplotlib inline\nimport torch\nfiles = !ls \\\n  -la\nx = 1"),
            ("code", "%%time\nfor i in range(2):\n    %time y = i\n    print(i)"),
            ("code", "%%bash\nnvidia-smi"),
            ("code", "pip install torch"),
            ("code", ""),
            ("code", "z = x + 1"),
        )
    )
    lines = [line.rstrip() for line in script.text.splitlines()]
    assert lines[:5] == ["None", "import torch", "files = None", "", "x = 1"]
    assert lines[5:9] == ["#%time", "for i in range(2):", "    None", "    print(i)"]
    assert lines[9:] == ["z = x + 1"]
    compile(script.text, "script", "exec")
    assert [script.locate(line) for line in (1, 5, 6, 9, 10)] == [(2, 1), (2, 5), (3, 1), (3, 4), (7, 1)]
    assert script.locate(11) is None
    assert script.warning() == (
        "not run (IPython only): cell 2, line 1 (`%matplotlib inline`); cell 2, line 3 (`files = !ls`); "
        "cell 3, line 1 (`%%time`); cell 3, line 3 (`%time y = i`); cell 4 (cell magic `%%bash`); "
        "cell 5 (automagic `pip`)"
    )


def test_display_is_defined_when_a_cell_calls_it() -> None:
    script = build_script(_notebook(("code", "import math"), ("code", "display(math.pi)")))
    namespace: dict = {}
    exec(compile(script.text, "script", "exec"), namespace)  # no NameError: display exists
    assert script.locate(script.text.count("\n")) == (2, 1)
    assert script.locate(1) is None  # the lines oom-lsp added are no cell's
    assert "display" not in build_script(_notebook(("code", "x = 1"))).text


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("for x in range(3)\n    pass", "cell 1, line 1: SyntaxError: expected ':'; Run All stops there too"),
        (
            "import asyncio\nawait asyncio.sleep(0)",
            "cell 1, line 2: `await` outside a function runs only in a kernel",
        ),
    ],
)
def test_a_cell_that_cannot_run_as_a_script_is_one_error(source: str, message: str) -> None:
    with pytest.raises(NotebookError) as raised:
        build_script(_notebook(("code", source), ("code", "x = 1")))
    assert str(raised.value).startswith(message)


def test_not_a_python_notebook_or_no_code_is_an_error() -> None:
    with pytest.raises(NotebookError, match="no code cell to run"):
        build_script(_notebook(("markdown", "# only prose"), ("code", "%%bash\nls")))
    with pytest.raises(NotebookError, match="invalid JSON"):
        build_script("{")


def test_places_name_script_lines_as_cells() -> None:
    script = build_script(_notebook(("markdown", "# T"), ("code", "import torch\n\nx = torch.ones(2)")))
    places = ScriptPlaces(script, ["/w/.nb.oom-lsp-1.py", ".nb.oom-lsp-1.py"], "nb.ipynb", "/w/nb.ipynb")
    assert places.text("crashed at .nb.oom-lsp-1.py:3: boom") == "crashed at nb.ipynb, cell 2, line 3: boom"
    traceback = 'File "/w/.nb.oom-lsp-1.py", line 1, in <module>'
    assert places.text(traceback) == 'File "nb.ipynb", cell 2, line 1, in <module>'
    report = places.report(
        {
            "script": "/w/.nb.oom-lsp-1.py",
            "peak_at": {"op": "aten.mm", "file": "/w/.nb.oom-lsp-1.py", "line": 3},
            "top_lines": [["/w/.nb.oom-lsp-1.py:3", 100], ["/lib/torch/nn.py:9", 5]],
            "batch_knobs": [{"file": "/w/.nb.oom-lsp-1.py", "line": 1}],
        }
    )
    assert report == {
        "script": "/w/nb.ipynb",
        "peak_at": {"op": "aten.mm", "file": "/w/nb.ipynb", "cell": 2, "line": 3},
        "top_lines": [["/w/nb.ipynb:cell 2:3", 100], ["/lib/torch/nn.py:9", 5]],
        "batch_knobs": [{"file": "/w/nb.ipynb", "cell": 2, "line": 1}],
    }
