"""A cloned repository written by someone who wants the user's machine: the planted files of
issue 28, and the commands a user runs in it (the installed console script, the language
server over stdio). tests/test_hostile_project.py asserts on them; bench/hostile_repo.py
prints the same figures.

Planted:
- a pyproject.toml whose memory budget gate names `evil.py`, a script that would write a
  marker holding the user's AWS_SECRET_ACCESS_KEY;
- `platform.py`, `json.py`, `torch.py`, `sitecustomize.py`, `usercustomize.py` in the
  folder, each writing a marker when imported (an interpreter probe run there would);
- a memory snapshot pickle whose `__reduce__` runs `os.system` (for `profile --import`);
- committed symbolic links where oom-lsp writes, each to the user's files: the temporary
  names (`.oom_lsp/profile/report.json.tmp`, `OOM_FIXES.md.tmp`), the files themselves
  (`.oom_lsp/profile/report.json`, the cache's `CACHEDIR.TAG`), whole folders
  (`.oom_lsp/explain`, `.oom_lsp/estimate`, `.oom_lsp/what-if`, `.oom_lsp/last_oom`, the
  cache's version folder), and `shared.py`, a training script outside the repository with
  a fixable finding;
- `deep.py`, 1,500 nested brackets (libcst's parser dies of it), beside an ordinary
  training script with findings.

Nothing may run (no marker), nothing outside the repository may change.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import oom_lsp

OOM_LSP = str(Path(sys.executable).parent / "oom-lsp")
SECRET = "aws-canary-wJalrXUtnFEMI-K7MDENG"
PLANTED_MODULES = ("platform", "json", "torch", "sitecustomize", "usercustomize")
TRAIN = """import torch


def train(model, loader, optimizer):
    total_loss = 0
    for inputs, labels in loader:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(inputs.cuda()), labels.cuda())
        loss.backward()
        optimizer.step()
        total_loss += loss
    return total_loss


if __name__ == "__main__":
    model = torch.nn.Linear(8, 2).cuda()
    model.load_state_dict(torch.load("model.pt"))
"""
TRAIN_LOSS_LINE = 11
SHARED = 'import torch\nmodel = torch.nn.Linear(4, 4).cuda()\nmodel.load_state_dict(torch.load("m.pt"))\n'
OOM_LOG = """Traceback (most recent call last):
  File "{path}", line 9, in train
    loss.backward()
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 6.00 GiB total capacity; 5.00 GiB already allocated; 3.00 MiB free; 5.10 GiB reserved in total by PyTorch)
"""


class _Payload:
    """A pickle that runs a shell command when loaded (what a planted snapshot would do)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (self.command,))


@dataclass
class HostileRepo:
    root: Path
    clone: Path  # the repository
    home: Path  # the user's files, outside it
    markers: Path  # what planted code writes when it runs
    env: dict[str, str]

    def markers_written(self) -> list[str]:
        return sorted(path.name for path in self.markers.iterdir())

    def outside(self) -> dict[str, Any]:
        """Everything outside the repository: the user's files and the markers."""
        return {**snapshot(self.home), **snapshot(self.markers)}

    def run(self, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [OOM_LSP, *argv],
            cwd=self.clone,
            env=self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


def snapshot(folder: Path) -> dict[str, Any]:
    """Every entry under `folder`: a file by its bytes, a link by its target, a folder by name."""
    entries: dict[str, Any] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_symlink():
            entries[str(path)] = os.readlink(path)
        elif path.is_file():
            entries[str(path)] = path.read_bytes()
        else:
            entries[str(path)] = "<folder>"
    return entries


def _marker_code(markers: Path, name: str) -> str:
    return (
        "import os\n"
        f"open(os.path.join({str(markers)!r}, {name!r}), 'w')"
        ".write(os.environ.get('AWS_SECRET_ACCESS_KEY', 'no key'))\n"
    )


def _link(path: Path, target: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(os.path.relpath(target, path.parent))


def plant(root: Path) -> HostileRepo:
    clone, home, markers = root / "clone", root / "home", root / "markers"
    for folder in (clone, home / "folder", markers, home / ".config"):
        folder.mkdir(parents=True)
    (home / ".bashrc").write_text("# the user's own\n")
    (home / "shared.py").write_text(SHARED)

    (clone / "pyproject.toml").write_text(
        "[tool.oom-lsp]\n"
        'budget = "1GiB"\n'
        'estimate-scripts = ["evil.py --epochs 1"]\n'
    )
    (clone / "evil.py").write_text(_marker_code(markers, "evil.py"))
    for name in PLANTED_MODULES:
        (clone / f"{name}.py").write_text(_marker_code(markers, f"{name}.py"))
    (clone / "train.py").write_text(TRAIN)
    (clone / "deep.py").write_text("import torch\nx = " + "(" * 1500 + "1" + ")" * 1500 + "\n")
    (clone / "oom.log").write_text(OOM_LOG.format(path=clone / "train.py"))
    (clone / "snapshot.pickle").write_bytes(
        pickle.dumps(_Payload(f"touch {markers / 'snapshot.pickle'}"))
    )
    from oom_lsp.profiling.report import DeviceInfo, Report, StepStats

    for name, peak in (("before.json", 600 * 2**20), ("after.json", 300 * 2**20)):
        report = Report(
            script=str(clone / "train.py"),
            status="completed",
            device=DeviceInfo("cpu"),
            steps=[StepStats(1, peak, None, 0.5)],
            peak_allocated=peak,
        )
        (clone / name).write_text(json.dumps(report.to_dict()))

    bashrc, folder = home / ".bashrc", home / "folder"
    _link(clone / ".oom_lsp" / "profile" / "report.json.tmp", bashrc)
    _link(clone / ".oom_lsp" / "profile" / "report.json", bashrc)
    _link(clone / ".oom_lsp" / "profile" / "trace.json", bashrc)
    for kind in ("explain", "estimate", "what-if", "last_oom", "validate"):
        _link(clone / ".oom_lsp" / kind, folder)
    _link(clone / ".oom_lsp_cache" / "CACHEDIR.TAG", bashrc)
    _link(clone / ".oom_lsp_cache" / oom_lsp.__version__, folder)
    _link(clone / "OOM_FIXES.md.tmp", bashrc)
    _link(clone / "shared.py", home / "shared.py")

    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("OOM_LSP_", "PYTHONPATH", "PYTHONSTARTUP"))
    }
    env.update(
        HOME=str(home),
        XDG_CONFIG_HOME=str(home / ".config"),  # no user config: nothing is trusted
        AWS_SECRET_ACCESS_KEY=SECRET,
    )
    return HostileRepo(root, clone, home, markers, env)


# --- What a user runs there ------------------------------------------------------------------

CLI_COMMANDS: dict[str, list[str]] = {
    "--check": ["--check", "."],
    "--check --fix": ["check", "--fix", "--unsafe-fixes", "."],
    "prompt": ["prompt", "train.py", "--line", str(TRAIN_LOSS_LINE), "--python", sys.executable],
    "rule": ["rule", "OOM301"],
    "profile --import": ["profile", "--import", "snapshot.pickle"],
    "compare": ["compare", "before.json", "after.json"],
    "explain": ["explain", "oom.log"],
}


def open_in_server(repo: HostileRepo) -> dict[str, Any]:
    """Open every Python file of the repository in the real server over stdio, asking after
    each open for its diagnostics, code lenses and code actions; then the OOM explanation of
    the log (written under `.oom_lsp/explain`). What each request answered, and whether the
    server was alive and answering after every file."""
    from tests.server.stdio_client import StdioServer

    server = StdioServer(repo.clone, env=repo.env, settings={"debounceMs": 0})
    answered: dict[str, Any] = {"files": {}, "alive_after_each": True}
    try:
        server.initialize()
        for path in sorted(repo.clone.glob("*.py")):
            uri = server.open(path, path.read_text(encoding="utf-8", errors="replace"))
            codes = sorted(diagnostic.get("code") for diagnostic in server.diagnostics(uri, timeout=60))
            lenses = server.call("textDocument/codeLens", {"textDocument": {"uri": uri}}, timeout=60)
            everything = {"start": {"line": 0, "character": 0}, "end": {"line": 1000, "character": 0}}
            actions = server.call(
                "textDocument/codeAction",
                {"textDocument": {"uri": uri}, "range": everything, "context": {"diagnostics": []}},
                timeout=60,
            )
            answered["files"][path.name] = {
                "codes": codes,
                "lenses": len(lenses.get("result") or []),
                "actions_answered": "result" in actions,
            }
            answered["alive_after_each"] &= server.process.poll() is None
        explained = server.call(
            "workspace/executeCommand",
            {"command": "oom-lsp.explainOom", "arguments": [{"path": str(repo.clone / "oom.log")}]},
            timeout=60,
        )
        answered["explain"] = explained.get("result") or explained.get("error")
        answered["shutdown"] = server.call("shutdown").get("result", "error")
        server.notify("exit")
        answered["exit_code"] = server.exit_code()
    finally:
        server.close()
    return answered
