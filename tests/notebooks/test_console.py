"""`oom-lsp --check` on notebooks through the installed console script, as a
person runs it: findings named by cell, --fix changing only the fixed cells'
sources (bytes compared), errors for files that are not notebooks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import nbformat

from tests.console import OOM_LSP
from tests.notebooks import shapes


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([OOM_LSP, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


def test_check_names_cells_and_fix_keeps_every_other_byte(tmp_path: Path) -> None:
    notebook = tmp_path / "train.ipynb"
    original = shapes.jupyter(shapes.notebook()).encode()
    notebook.write_bytes(original)
    (tmp_path / "clean.py").write_text("import torch\n")
    checked = _run(["--check", "--no-cache", "."], tmp_path)
    assert checked.returncode == 1, checked.stderr
    assert "train.ipynb:cell 4:9:5: OOM301 [*]" in checked.stdout
    assert "OOM000" not in checked.stdout  # magics, %%time and !pip are no syntax errors
    # The checkpoint of the notebook's small model is restored onto the GPU: strict mode shows it.
    checked = _run(["--check", "--no-cache", "--strict", "."], tmp_path)
    assert "train.ipynb:cell 4:9:5: OOM301 [*]" in checked.stdout
    assert "train.ipynb:cell 6:1:8: OOM501 [*]" in checked.stdout
    strict = ["--check", "--no-cache", "--strict"]
    report = json.loads(_run([*strict, "--format", "json", "train.ipynb"], tmp_path).stdout)
    assert {(item["code"], item["cell"], item["line"]) for item in report} >= {("OOM301", 4, 9), ("OOM501", 6, 1)}
    diff = _run([*strict, "--diff", "train.ipynb"], tmp_path)
    assert "--- train.ipynb:cell 4" in diff.stdout and notebook.read_bytes() == original
    fixed = _run([*strict, "--fix", "train.ipynb"], tmp_path)
    assert "2 fixed" in fixed.stdout, fixed.stdout + fixed.stderr
    after = notebook.read_bytes().decode()
    before_nb, after_nb = json.loads(original), json.loads(after)
    changed = [i for i, (a, b) in enumerate(zip(before_nb["cells"], after_nb["cells"])) if a != b]
    assert changed == [3, 5]
    for index in changed:
        after_nb["cells"][index]["source"] = before_nb["cells"][index]["source"]
    assert after_nb == before_nb  # outputs, ids, metadata untouched
    # Bytes outside the two sources: the same.
    assert after.startswith(original.decode()[: original.decode().index('"source": [\n    "%%time')])
    nbformat.validate(nbformat.reads(after, as_version=4))
    assert _run([*strict, "--fix", "train.ipynb"], tmp_path).stdout.count("fixed") == 0


def test_sarif_and_github_point_into_the_ipynb(tmp_path: Path) -> None:
    notebook = tmp_path / "train.ipynb"
    text = shapes.jupyter(shapes.notebook())
    notebook.write_text(text)
    sarif = json.loads(_run(["--check", "--no-cache", "--format", "sarif", "train.ipynb"], tmp_path).stdout)
    result = next(r for r in sarif["runs"][0]["results"] if r["ruleId"] == "OOM301")
    region = result["locations"][0]["physicalLocation"]["region"]
    line = text.splitlines()[region["startLine"] - 1]
    assert line[region["startColumn"] - 1 :].startswith("total_loss += loss")
    assert result["properties"] == {"cell": 4, "cellLine": 9, "cellColumn": 5}
    github = _run(["--check", "--no-cache", "--format", "github", "train.ipynb"], tmp_path).stdout
    assert f"line={region['startLine']},col={region['startColumn']}" in github
    assert "title=OOM301 (cell 4%3A9%3A5)" in github


def test_files_that_are_not_notebooks_are_one_error_each(tmp_path: Path) -> None:
    (tmp_path / "broken.ipynb").write_text('{"cells": [')
    (tmp_path / "old.ipynb").write_text('{"nbformat": 3, "nbformat_minor": 0, "worksheets": []}')
    before = {path.name: path.read_bytes() for path in tmp_path.iterdir()}
    checked = _run(["--check", "--no-cache", "--fix", "."], tmp_path)
    assert checked.returncode == 1
    errors = [line for line in checked.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: broken.ipynb: not a notebook: invalid JSON: Expecting value at line 1, column 12",
        "error: old.ipynb: nbformat 3 is not supported, only nbformat 4 "
        "(convert it with `jupyter nbconvert --to notebook --nbformat 4`)",
    ]
    assert "Traceback" not in checked.stderr
    assert {path.name: path.read_bytes() for path in tmp_path.iterdir()} == before
