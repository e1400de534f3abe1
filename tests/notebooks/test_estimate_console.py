"""`oom-lsp estimate nb.ipynb` through the installed console script, as a person
runs it from another folder: the code cells run in order as a script in the
notebook's folder (its modules import, its relative paths open, as in its
kernel), magics are skipped with a warning naming the cells, and every place the
estimate names is a cell and a line in it, in text, JSON and errors."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import nbformat

from tests.console import OOM_LSP

SETUP = "%matplotlib inline\n!pip install -q torch\nimport json\nimport torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom models import make_model"
DATA = "config = json.load(open('config.json'))\nfeatures = torch.randn(256, 64)\nlabels = torch.randint(0, 4, (256,))\nloader = DataLoader(TensorDataset(features, labels), batch_size=config['batch_size'], shuffle=True)"
MODEL = "device = 'cuda' if torch.cuda.is_available() else 'cpu'\nmodel = make_model().to(device)\noptimizer = torch.optim.Adam(model.parameters(), lr=1e-3)\ncriterion = torch.nn.CrossEntropyLoss()\ndisplay(model)"
TRAIN = "%%time\nfor epoch in range(1):\n    for x, y in loader:\n        x, y = x.to(device), y.to(device)\n        loss = criterion(model(x), y)\n        optimizer.zero_grad()\n        loss.backward()\n        optimizer.step()"
MODELS_PY = "import torch.nn as nn\n\n\ndef make_model():\n    return nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 4))\n"


def _project(tmp_path: Path, train: str = TRAIN) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [
        nbformat.v4.new_markdown_cell("# A small classifier"),
        nbformat.v4.new_code_cell(SETUP),
        nbformat.v4.new_code_cell(DATA),
        nbformat.v4.new_code_cell(MODEL),
        nbformat.v4.new_markdown_cell("## Training"),
        nbformat.v4.new_code_cell(train),
        nbformat.v4.new_code_cell("%%bash\nnvidia-smi"),
    ]
    notebook.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    nbformat.write(notebook, project / "train.ipynb")
    (project / "models.py").write_text(MODELS_PY)
    (project / "config.json").write_text('{"batch_size": 32}')
    return project


def _listing(project: Path) -> list[str]:
    """The project's files, but for the `__pycache__` Python writes when the notebook imports
    its module (as its kernel would; absent where PYTHONDONTWRITEBYTECODE is set)."""
    return sorted(path.name for path in project.iterdir() if path.name != "__pycache__")


def _after_running(stderr: str) -> str:
    """stderr without the line naming what runs (the first one, when the estimate starts)."""
    first, _, rest = stderr.partition("\n")
    return rest if first.startswith("oom-lsp estimate: running ") else stderr


def _top_lines(output: str) -> list[str]:
    lines = output.splitlines()
    start = end = lines.index("  top lines at the peak:") + 1
    while end < len(lines) and lines[end].startswith("    "):
        end += 1
    return [line.strip() for line in lines[start:end]]


def _estimate(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OOM_LSP, "estimate", "project/train.ipynb", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_estimate_runs_the_cells_and_names_cells(tmp_path: Path) -> None:
    project = _project(tmp_path)
    before = _listing(project)
    text = _estimate(tmp_path, "--gpu-memory", "8GiB")
    assert text.returncode == 0, text.stderr
    assert _after_running(text.stderr).splitlines()[0] == (
        "oom-lsp estimate: warning: project/train.ipynb: not run (IPython only): cell 2, line 1 "
        "(`%matplotlib inline`); cell 2, line 2 (`!pip install -q torch`); cell 6, line 1 (`%%time`); "
        "cell 7 (cell magic `%%bash`)"
    )
    assert text.stdout.startswith("project/train.ipynb: batch size 32, device cuda")
    peak = next(line for line in text.stdout.splitlines() if line.startswith("  peak at:"))
    assert peak.endswith(", project/train.ipynb, cell 6, line 8")  # optimizer.step()
    places = [line.split("  ", 1)[1].strip() for line in _top_lines(text.stdout)]
    assert "project/train.ipynb, cell 6, line 8" in places
    # The notebook's own module counts as the user's code, as in its kernel.
    assert "project/models.py:5" in places
    assert ".oom-lsp-" not in text.stdout + text.stderr
    assert _listing(project) == before  # the script is gone

    report = json.loads(_estimate(tmp_path, "--format", "json").stdout)
    assert report["script"] == str(project / "train.ipynb")
    assert report["peak_at"]["file"] == str(project / "train.ipynb")
    assert (report["peak_at"]["cell"], report["peak_at"]["line"]) == (6, 8)
    assert report["top_lines"][0][0].startswith(str(project / "train.ipynb") + ":cell ")
    assert report["batch_knobs"] == [
        {"kind": "DataLoader(batch_size=...)", "file": str(project / "train.ipynb"), "line": 4, "cell": 3}
    ]
    assert report["notebook"]["cells_run"] == [2, 3, 4, 6]
    assert {"cell": 7, "line": None, "code": "cell magic `%%bash`"} in report["notebook"]["not_run"]


def test_a_crash_in_a_cell_is_named_by_its_cell(tmp_path: Path) -> None:
    _project(
        tmp_path, train="for x, y in loader:\n    loss = criterion(model(x), y[:3])\n    loss.backward()"
    )
    crashed = _estimate(tmp_path)
    assert crashed.returncode == 2
    assert "the script crashed at project/train.ipynb, cell 6, line 2: ValueError" in crashed.stderr
    assert "    project/train.ipynb, cell 6, line 2, in <module>" in crashed.stderr
    assert ".oom-lsp-" not in crashed.stderr
    report = json.loads(_estimate(tmp_path, "--format", "json").stdout)
    assert report["error"].startswith("the script crashed at project/train.ipynb, cell 6, line 2")


def test_a_cell_that_cannot_run_or_a_broken_file_is_one_line(tmp_path: Path) -> None:
    project = _project(tmp_path, train="for x, y in loader\n    pass")
    broken = _estimate(tmp_path)
    assert broken.returncode == 2
    assert _after_running(broken.stderr) == (
        "oom-lsp estimate: project/train.ipynb: cell 6, line 1: SyntaxError: expected ':'; "
        "Run All stops there too\n"
    )
    (project / "train.ipynb").write_text('{"cells": [')
    invalid = _estimate(tmp_path)
    assert invalid.returncode == 2
    assert _after_running(invalid.stderr) == (
        "oom-lsp estimate: project/train.ipynb: not a notebook: invalid JSON: "
        "Expecting value at line 1, column 12\n"
    )
    assert _listing(project) == ["config.json", "models.py", "train.ipynb"]
