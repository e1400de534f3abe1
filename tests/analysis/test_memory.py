"""An analysis keeps nothing alive once its findings are returned.

The editor analyses a document after every pause in typing. What one analysis
builds (its FileContext: the module, the per-file facts of the rules) must be
freed with it: kept, every version's trees stayed in memory for the server's
life and each collection of the older generations walked them all (the 50-cell
notebook of bench/lsp_latency.py grew by ~15,000 objects an edit). Freed by
reference counting alone, without the cyclic collector, it is also freed at
once instead of in a pause in the middle of a later analysis.
"""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from oom_lsp.analysis import analyze, default_settings
from oom_lsp.analysis.context import FileContext
from oom_lsp.analysis.incremental import IncrementalParser
from oom_lsp.notebooks.program import CellText, IncrementalNotebook

ROOT = Path(__file__).resolve().parents[2]
# Training scripts that put models and data on CUDA: every rule of the catalogue runs on them,
# the device rules' per-file answers included.
RISKY = sorted((ROOT / "fixtures").glob("*_risky.py"))


def live_contexts() -> int:
    # type(), not isinstance(): the rules hold weak proxies of contexts, which isinstance() follows.
    return sum(1 for item in gc.get_objects() if type(item) is FileContext)


@pytest.fixture
def collector_off():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@pytest.mark.parametrize("path", RISKY, ids=lambda path: path.name)
def test_an_analysis_frees_its_context_without_the_collector(path: Path, collector_off: None) -> None:
    findings = analyze(path.read_text(encoding="utf-8"), default_settings(), path.name)
    assert findings  # the rules ran and reported: their state was built
    assert live_contexts() == 0


def test_successive_versions_keep_no_context(collector_off: None) -> None:
    text = RISKY[0].read_text(encoding="utf-8")
    parser = IncrementalParser()
    for edit in range(5):
        analyze(f"# edit {edit}\n{text}", default_settings(), "edited.py", parse=parser.parse)
    assert live_contexts() == 0


def test_a_notebook_keeps_no_context_across_edits(collector_off: None) -> None:
    cells = [path.read_text(encoding="utf-8") for path in RISKY[:3]]
    notebook = IncrementalNotebook()
    for edit in range(4):
        texts = [CellText(index, source, index + 1) for index, source in enumerate(cells)]
        texts[1] = CellText(1, f"# edit {edit}\n{cells[1]}", 2)
        analysis = notebook.analyze(texts, default_settings(), "edited.ipynb")
        assert analysis.all_findings()
    assert live_contexts() == 0
