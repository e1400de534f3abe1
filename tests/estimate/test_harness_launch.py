"""How the estimate harness is started: by path, under a private package name, so that the user's
script sees what `python train.py` shows it and its modules never meet the harness's."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from oom_lsp.estimate.estimator import EstimateOptions, run_harness

HARNESS = Path(__file__).resolve().parents[2] / "oom_lsp" / "estimate" / "harness"

# Named like the harness's own modules: the script must import these, not the harness's.
USER_MODULES = ("tracker", "runner", "common", "data", "cuda", "shims", "memo", "context")

OBSERVER = """
import json, os, pickle, sys

import torch

import {modules}

class Batch:
    pass

seen = {{
    "argv": sys.argv,
    "name": __name__,
    "main_file": sys.modules["__main__"].__file__,
    "file": __file__,
    "spec": repr(__spec__),
    "path": sys.path,
    "own_modules": [sys.modules[name].WHO for name in {names!r}],
    # oom-lsp's package (bench/torchvision_without_ops.py's oom_lsp_torchvision_without_ops, which a
    # .pth in a bench venv imports at every interpreter start, is not part of it).
    "oom_lsp_modules": sorted(name for name in sys.modules if name == "oom_lsp" or name.startswith("oom_lsp.")),
    "pickles_main_class": len(pickle.dumps(Batch())) > 0,
}}
with open(sys.argv[1], "w") as handle:
    json.dump(seen, handle)

model = torch.nn.Linear(4, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
"""


def _write_script(folder: Path) -> Path:
    for name in USER_MODULES:
        (folder / f"{name}.py").write_text(f"WHO = 'user {name}'\n")
    script = folder / "train.py"
    script.write_text(OBSERVER.format(modules=", ".join(USER_MODULES), names=USER_MODULES))
    return script


def test_the_script_sees_what_running_it_directly_shows(tmp_path):
    script = _write_script(tmp_path)
    seen = tmp_path / "seen.json"
    arguments = [str(seen), "--lr", "0.1"]
    subprocess.run([sys.executable, str(script), *arguments], check=True, cwd=tmp_path, timeout=120)
    direct = json.loads(seen.read_text())
    options = EstimateOptions(script=script, script_args=arguments, device="cpu", cwd=tmp_path, timeout=120)
    for mode in ("fake", "real"):
        seen.unlink()
        (result,) = run_harness(options, [{}], mode=mode)
        assert result["status"] == "stopped", result.get("failure")
        harness = json.loads(seen.read_text())
        assert harness["own_modules"] == [f"user {name}" for name in USER_MODULES]
        assert harness["oom_lsp_modules"] == []
        assert harness == direct


def test_the_harness_imports_nothing_of_oom_lsp_but_itself():
    for path in HARNESS.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                assert not node.module.startswith("oom_lsp"), f"{path.name}: from {node.module} import"
            elif isinstance(node, ast.Import):
                assert not any(alias.name.startswith("oom_lsp") for alias in node.names), path.name


def test_started_by_path_in_isolated_mode(tmp_path):
    # -I: PYTHONPATH and the user site ignored, the launcher's folder not put on sys.path: the
    # harness finds its modules from its own file, and imports no module of oom_lsp.
    script = _write_script(tmp_path)
    request = tmp_path / "request.json"
    request.write_text(
        json.dumps(
            {
                "script": str(script),
                "args": [str(tmp_path / "seen.json")],
                "mode": "fake",
                "device": "cpu",
                "output": str(tmp_path / "result.json"),
            }
        )
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    subprocess.run(
        [sys.executable, "-I", str(HARNESS / "__main__.py"), "--request", str(request)],
        check=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    (result,) = json.loads((tmp_path / "result.json").read_text())["runs"]
    assert result["status"] == "stopped"
    assert json.loads((tmp_path / "seen.json").read_text())["oom_lsp_modules"] == []
