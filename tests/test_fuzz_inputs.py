"""A part of the generated corpus of tests/fuzz_corpus.py (the whole is bench/fuzz_inputs.py):
the installed `oom-lsp --check` and the real server over stdio take every file without a
crash, an analysis failure or an unanswered request."""

from __future__ import annotations

import re
from pathlib import Path

from tests.console import run
from tests.fuzz_corpus import open_each_in_server, write_corpus

CHOSEN = re.compile(
    r"nest_(parens|lists|unary|subscripts|sum|fstrings|blocks)_(1500|100000|after_error)\.py"
    r"|line_(name|tuple)\.py|byte_(000|010|013|027|128|255)\.py|bytes_(every|random_0|utf16)\.py"
    r"|nb_deep_\w+\.ipynb|nb_random_[0-4]\.ipynb|nb_shaped_[0-4]\.ipynb|nb_not_utf8\.ipynb"
)


def _corpus(tmp_path: Path) -> list[Path]:
    files = write_corpus(tmp_path, only=lambda name: CHOSEN.fullmatch(name) is not None)
    (tmp_path / "pyproject.toml").write_text('[tool.oom-lsp]\nmax-file-size = "16MiB"\n')
    return files


def test_the_check_takes_every_file(tmp_path: Path) -> None:
    files = _corpus(tmp_path)
    assert len(files) > 30
    done = run(["--check", "--no-cache", "."], tmp_path, timeout=600)
    assert done.returncode == 1, done.stderr[-3000:]  # findings (OOM000) and unreadable notebooks
    assert "failed while checking" not in done.stderr and "Traceback" not in done.stderr
    assert "nest_parens_100000.py:2:205: OOM000 SyntaxError: too many nested parentheses" in done.stdout
    assert "nest_subscripts_1500.py:2:5: OOM000 SyntaxError: nested too deeply to analyse" in done.stdout
    assert "nb_deep_unary.ipynb:cell 1:" in done.stdout


def test_the_server_takes_every_file_and_answers_after_each(tmp_path: Path) -> None:
    files = _corpus(tmp_path)
    served = open_each_in_server(files, tmp_path)
    assert served["deaths"] == []
    assert served["unanswered"] == []
    assert served["opened"] + served["skipped"] == len(files)
    assert served["shutdown"] and served["exit_code"] == 0
