"""The notebook program (oom_lsp.notebooks.program): the editor's incremental
analysis gives, version after version, what a fresh analysis of the same cells
gives."""

from __future__ import annotations

import ast
from dataclasses import replace

from oom_lsp.analysis import default_settings
from oom_lsp.notebooks.program import CellText, IncrementalNotebook, analyze_cells, build_program
from tests.notebooks.shapes import LOAD, MODEL, SETUP, TRAIN


def _cells(*sources: str) -> list[CellText]:
    return [CellText(index, source, index + 1) for index, source in enumerate(sources)]


def _summary(analysis) -> dict:
    return {
        key: [(f.code, f.range, f.statement_line, f.cell, f.fix) for f in findings]
        for key, findings in analysis.findings.items()
    }


def test_incremental_analysis_equals_a_fresh_one_for_every_version() -> None:
    # Strict mode: every finding the rules prove is compared (the small model's
    # checkpoint load is not shown by default).
    settings = replace(default_settings(), strict=True)
    notebook = IncrementalNotebook()
    versions = [
        _cells(SETUP, MODEL, TRAIN, LOAD),
        _cells(SETUP, MODEL, "# edited\n" + TRAIN, LOAD),  # lines of the later cells move
        _cells(SETUP, MODEL, TRAIN.replace("for x, y", "for x, y in"), LOAD),  # a syntax error mid-typing
        _cells(SETUP, MODEL, TRAIN, LOAD, LOAD),  # the same text in two cells
        _cells(SETUP, "%%bash\nls", TRAIN, LOAD),  # a cell becomes a shell cell
        _cells(SETUP, MODEL, TRAIN.replace("total_loss += loss", "total_loss += loss.item()"), LOAD),
        _cells(SETUP, MODEL, TRAIN, LOAD),
    ]
    for cells in versions:
        incremental = notebook.analyze(cells, settings, "nb.ipynb")
        fresh = analyze_cells(cells, settings, "nb.ipynb")
        assert _summary(incremental) == _summary(fresh)
        assert incremental.skipped == fresh.skipped
        assert incremental.program.text == fresh.program.text
    # The versions did find things: the loop's accumulation, the syntax error, the load.
    codes = {f.code for cells in versions for f in analyze_cells(cells, settings, "nb.ipynb").all_findings()}
    assert {"OOM000", "OOM301", "OOM501"} <= codes


def test_a_dedented_cell_reports_its_own_columns_and_offers_no_fix() -> None:
    # IPython runs a cell whose first line is indented dedented (real notebooks have
    # cells starting with " # comment"): no syntax error, columns of the cell's text.
    loop = "  total = 0\n  for x, y in loader:\n      loss = criterion(model(x), y)\n      total += loss"
    analysis = analyze_cells(_cells(SETUP, MODEL, loop), default_settings(), "nb.ipynb")
    (finding,) = [f for f in analysis.findings[2] if f.code != "OOM701"]
    assert (finding.code, finding.range.start.line, finding.range.start.column) == ("OOM301", 4, 6)
    assert finding.fix is None


def test_the_program_tree_joined_from_the_cells_is_the_whole_parse_for_every_version() -> None:
    # Each cell's tree is kept by its text and its first line: a cell that moves is compiled
    # again, one that stays is not, and the joined tree is ast.parse of the program every time.
    settings = default_settings()
    notebook = IncrementalNotebook()
    dedented = "  total = 0\n  for x, y in loader:\n      total += criterion(model(x), y)"
    versions = [
        _cells(SETUP, MODEL, TRAIN, LOAD),
        _cells(SETUP, "# edited\n" + MODEL, TRAIN, LOAD),  # the cells below move down a line
        _cells(SETUP, MODEL, TRAIN, LOAD),  # and back up
        _cells(SETUP, MODEL.replace("0.1", "0.01"), TRAIN, LOAD),  # same lines, one cell changed
        _cells(SETUP, LOAD, MODEL, TRAIN),  # cells reordered: same texts, other lines
        _cells(SETUP, MODEL, TRAIN, LOAD, LOAD),  # the same text twice
        _cells(SETUP, "await asyncio.sleep(0)\n", MODEL, dedented),  # IPython's top-level await
        _cells(SETUP.replace("\n", "\r\n"), MODEL, "x = 1", TRAIN),  # CRLF; no final newline
        _cells(SETUP, "def broken(:\n", MODEL, TRAIN),  # a cell left out of the program
        _cells(MODEL, TRAIN),
    ]
    for cells in versions:
        program = build_program(cells, settings)[0]
        joined = notebook.program_tree(program)
        whole = ast.parse(program.text)
        assert ast.dump(joined, include_attributes=True) == ast.dump(whole, include_attributes=True)
        incremental = notebook.analyze(cells, settings, "nb.ipynb")
        assert _summary(incremental) == _summary(analyze_cells(cells, settings, "nb.ipynb"))
