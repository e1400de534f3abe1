"""OOM000's place: always on its line, so the CLI and an editor (which can only draw it there)
report the same one. libcst's raw column can lie past the end of its raw line: for the call
below, left open by a pasted line, its raw place is line 5, column 11, on the 5-character line
`    )`; the CLI printed 5:12 where the server drew 5:6 (bench/sustained_edits.py found it)."""

from __future__ import annotations

import libcst as cst

from oom_lsp.analysis import analyze, default_settings

SOURCE = (
    "import torch\n"
    "progress = meter(\n"
    "    len(loader), prefix='x'\n"
    "    buffer = torch.empty(1024, device='cuda')\n"
    "    )\n"
)


def test_the_syntax_error_is_on_a_character_of_its_line() -> None:
    try:
        cst.parse_module(SOURCE)
    except cst.ParserSyntaxError as error:
        libcst_place = (error.raw_line, error.raw_column)
    lines = SOURCE.splitlines()
    [finding] = analyze(SOURCE, default_settings(), "train.py")
    assert finding.code == "OOM000"
    line = lines[finding.range.start.line - 1]
    assert finding.range.start.line == libcst_place[0]
    assert 0 <= finding.range.start.column < len(line)
    assert finding.range.end.column <= len(line)
