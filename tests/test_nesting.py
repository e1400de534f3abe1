"""Text nested deeper than libcst's parser can take (oom_lsp.python_ast.check_nesting):
1,500 nested brackets used to kill `oom-lsp --check` with SIGSEGV (exit 139, no output:
every other file's findings lost) and the language server on open. Now such a file is
OOM000 with CPython's own words, and the other files are checked; a worker of the pool
that dies anyway costs only its file."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import libcst as cst
import pytest

from oom_lsp import checker, python_ast
from oom_lsp.analysis import default_settings
from oom_lsp.analysis.incremental import IncrementalParser
from tests.console import run

LEAK = "import torch\ntotal = 0\nfor batch in loader:\n    loss = model(batch)\n    loss.backward()\n    total += loss\n"


def _nested(kind: str, depth: int) -> str:
    makers = {
        "brackets": lambda: "x = " + "(" * depth + "1" + ")" * depth,
        "lists": lambda: "x = " + "[" * depth + "1" + "]" * depth,
        "unary": lambda: "x = " + "-" * depth + "y",
        "not": lambda: "x = " + "not " * depth + "y",
        "attributes": lambda: "x = y" + ".a" * depth,
        "subscripts": lambda: "x = y" + "[0]" * depth,
        "calls": lambda: "x = y" + "()" * depth,
        "power": lambda: "x = " + "**".join(["y"] * depth),
        "lambdas": lambda: "x = " + "lambda: " * depth + "y",
        "conditionals": lambda: "x = " + "y if z else " * depth + "y",
        "blocks": lambda: "".join(" " * level + "if x:\n" for level in range(depth)) + " " * depth + "pass",
    }
    return makers[kind]() + "\n"


def _refusal(source: str) -> cst.ParserSyntaxError:
    with pytest.raises(cst.ParserSyntaxError) as refused:
        python_ast.check_nesting(source)
    return refused.value


@pytest.mark.parametrize("kind", ["brackets", "lists"])
def test_more_brackets_than_cpython_takes_is_its_syntax_error(kind: str) -> None:
    error = _refusal("import torch\n" + _nested(kind, 1500))
    assert error.message == "too many nested parentheses"
    assert (error.raw_line, error.raw_column) == (2, 204)  # where CPython's tokenizer stops


def test_more_blocks_than_cpython_takes_is_its_indentation_error() -> None:
    error = _refusal(_nested("blocks", 150))
    assert error.message == "too many levels of indentation"


@pytest.mark.parametrize(
    "kind", ["unary", "not", "attributes", "subscripts", "calls", "power", "lambdas", "conditionals"]
)
def test_chains_cpython_accepts_but_libcst_would_choke_on_are_refused(kind: str) -> None:
    # 600 levels: valid Python, but seconds of libcst's time growing with the square of the depth.
    error = _refusal("import torch\n" + _nested(kind, 600))
    assert error.message == f"nested too deeply to analyse (more than {python_ast.MAX_NESTING} levels)"
    assert error.raw_line == 2


@pytest.mark.parametrize("kind", ["unary", "attributes", "subscripts", "power"])
def test_nesting_past_cpythons_own_parser_is_named_with_its_error(kind: str) -> None:
    error = _refusal("import torch\n" + _nested(kind, 100_000))
    assert error.message.startswith("too deeply nested for Python's parser (")
    assert "RecursionError" in error.message or "MemoryError" in error.message


def test_deep_nesting_after_an_ordinary_syntax_error_is_still_refused() -> None:
    # CPython stops at line 2; the chain of line 3 would still take libcst minutes.
    error = _refusal("import torch\ndef broken(:\n" + _nested("subscripts", 5000))
    assert (error.raw_line, error.message) == (2, "invalid syntax")


def test_ordinary_code_and_ordinary_syntax_errors_are_libcsts() -> None:
    assert python_ast.check_nesting(LEAK) is not None  # CPython's tree, kept for the positions
    assert python_ast.check_nesting("import torch\ndef broken(:\n    pass\n") is None
    deep_but_fine = "import torch\n" + _nested("brackets", 150) + _nested("unary", 300)
    assert python_ast.check_nesting(deep_but_fine) is not None


@pytest.mark.parametrize("parse", ["whole", "incremental"])
def test_the_analysis_reports_oom000_for_every_parse_path(parse: str) -> None:
    source = LEAK + _nested("brackets", 100_000)
    parser = IncrementalParser().parse if parse == "incremental" else None
    findings = checker.analyze_text(source, default_settings(), "deep.py", parser)
    assert [(finding.code, finding.message) for finding in findings] == [
        ("OOM000", "SyntaxError: too many nested parentheses")
    ]


def test_the_check_reports_the_file_and_checks_the_others(tmp_path: Path) -> None:
    (tmp_path / "deep.py").write_text("import torch\n" + _nested("brackets", 1500))
    (tmp_path / "chain.py").write_text("import torch\n" + _nested("subscripts", 3000))
    (tmp_path / "train.py").write_text(LEAK)
    done = run(["--check", "--no-cache", "."], tmp_path, timeout=120)
    assert done.returncode == 1, done.stderr
    assert "deep.py:2:205: OOM000 SyntaxError: too many nested parentheses" in done.stdout
    assert "chain.py:2:1: OOM000 SyntaxError: too deeply nested for Python's parser" in done.stdout
    assert "train.py:6:5: OOM301" in done.stdout


def crashes_on_boom(job: checker.Job) -> checker.JobResult:
    """A job runner for the pool whose worker dies natively on one file (as a crash in a
    native parser does): importable by the spawned workers."""
    if job.path.endswith("boom.py"):
        os.kill(os.getpid(), signal.SIGSEGV)
    return checker.run_job(job)


def test_a_worker_that_dies_costs_only_its_own_file() -> None:
    settings = default_settings()
    names = ["a.py", "boom.py", "c.py", "d.py", "e.py"]
    jobs = [checker.Job(index, name, LEAK, settings, False, False) for index, name in enumerate(names)]
    results = checker.run_jobs(jobs, workers=2, runner=crashes_on_boom)
    assert [result.index for result in results] == [0, 1, 2, 3, 4]
    for result in results:
        if result.index == 1:
            assert result.findings == []
            assert result.internal_error is not None
            assert result.internal_error.strip().splitlines()[-1] == (
                "WorkerDied: the analysis process died (SIGSEGV) while checking this file"
            )
        else:
            assert [finding.code for finding in result.findings] == ["OOM301"], result
