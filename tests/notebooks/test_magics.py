"""IPython's escapes become Python of the same shape; what is not Python is skipped.
The cases follow IPython's own transformer (IPython.core.inputtransformer2)."""

from __future__ import annotations

import pytest

from oom_lsp.notebooks.magics import mask_cell


@pytest.mark.parametrize(
    ("source", "masked", "lines"),
    [
        ("%matplotlib inline\nimport torch\n", "_                 \nimport torch\n", {1}),
        ("!pip install a \\\n    b\nx = 1", "_               \n     \nx = 1", {1, 2}),
        ("files = !ls\nfor f in files:\n    !echo $f\n", "files = _  \nfor f in files:\n    _       \n", {1, 3}),
        ("t = %timeit -o f()\n", "t = _             \n", {1}),
        ("model?\n??model\n", "_     \n_      \n", {1, 2}),
        ("%%time\nfor i in range(3):\n    pass", "#%time\nfor i in range(3):\n    pass", {1}),
        # Not escapes: inside brackets, strings, after a continuation, comparisons.
        ('x = (10\n% 3)\ns = """\n%not\n"""\ny = 1 \\\n  % 2\nz = a != b\n', None, set()),
    ],
)
def test_escapes_are_masked_keeping_lines_and_columns(source: str, masked: str | None, lines: set[int]) -> None:
    result = mask_cell(source)
    expected = source if masked is None else masked
    assert result.text == expected
    assert set(result.masked_lines) == lines
    assert [len(line) for line in result.text.split("\n")] == [len(line) for line in source.split("\n")]
    compile(result.text, "<cell>", "exec")


@pytest.mark.parametrize(
    ("source", "why"),
    [
        ("%%bash\nls -l", "cell magic `%%bash`"),
        ("%%writefile train.py\nimport torch", "cell magic `%%writefile`"),
        ("pip install torch", "automagic `pip`"),
        ("cd /data", "automagic `cd`"),
    ],
)
def test_cells_that_are_not_python_are_skipped(source: str, why: str) -> None:
    result = mask_cell(source)
    assert result.text is None and result.skipped == why


def test_an_automagic_name_assigned_is_python() -> None:
    assert mask_cell("time = 5\nrun = time + 1").text == "time = 5\nrun = time + 1"


def test_a_cell_indented_as_a_whole_runs_dedented_as_in_ipython() -> None:
    # Pasted code, or a leading space before a comment: IPython's `leading_indent`
    # takes the first line's indentation off every line that starts with it.
    result = mask_cell(" # Make sure we have a GPU\n device = 'cuda'\n device\n!nvidia-smi")
    assert result.text == "# Make sure we have a GPU\ndevice = 'cuda'\ndevice\n_          "
    assert (result.dedent, set(result.dedented_lines), set(result.masked_lines)) == (1, {1, 2, 3}, {4})
    assert result.column_in_cell(2, 0) == 1 and result.column_in_cell(4, 0) == 0
    compile(result.text, "<cell>", "exec")
