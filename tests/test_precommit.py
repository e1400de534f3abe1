"""The pre-commit hooks, run for real with `pre-commit try-repo` against a
temporary git repository.

try-repo installs this repository's committed HEAD into a fresh virtualenv
(pip, from PyPI), so these tests see committed code only: ~20 s each.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.samples import FIXED, RISKY

REPO = Path(__file__).resolve().parents[1]


def _pre_commit() -> str | None:
    candidate = Path(sys.executable).parent / "pre-commit"
    return str(candidate) if candidate.exists() else shutil.which("pre-commit")


def _head_with_hooks() -> str | None:
    """The committed HEAD, when it has the hooks manifest."""
    if not (REPO / ".git").exists():
        return None
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False)
    if head.returncode != 0:
        return None
    manifest = subprocess.run(
        ["git", "cat-file", "-e", "HEAD:.pre-commit-hooks.yaml"], cwd=REPO, capture_output=True, check=False
    )
    return head.stdout.strip() if manifest.returncode == 0 else None


def test_manifest_declares_both_hooks() -> None:
    from pre_commit.clientlib import load_manifest

    hooks = {hook["id"]: hook for hook in load_manifest(str(REPO / ".pre-commit-hooks.yaml"))}
    assert set(hooks) == {"oom-lsp-check", "oom-lsp-fix"}
    check, fix = hooks["oom-lsp-check"], hooks["oom-lsp-fix"]
    assert check["entry"] == "oom-lsp --check --force-exclude --no-budget"
    assert fix["entry"].split() == [
        "oom-lsp",
        "--check",
        "--force-exclude",
        "--no-budget",
        "--fix",
        "--exit-non-zero-on-fix",
    ]
    for hook in (check, fix):
        assert hook["language"] == "python"
        assert hook["types_or"] == ["python", "pyi", "jupyter"]
        assert hook["require_serial"] is True


@pytest.fixture
def user_repo(tmp_path: Path) -> Path:
    repo = tmp_path / "user-repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "pyproject.toml").write_text('[tool.oom-lsp]\nextend-exclude = ["legacy"]\n')
    (repo / "risky.py").write_text(RISKY)
    (repo / "clean.py").write_text("import torch\nx = torch.zeros(3)\n")
    (repo / "legacy").mkdir()
    (repo / "legacy" / "old.py").write_text(RISKY)
    subprocess.run(["git", "add", "."], cwd=repo, check=True)
    return repo


def try_repo(user_repo: Path, *args: str) -> tuple[int, str]:
    pre_commit = _pre_commit()
    head = _head_with_hooks()
    if pre_commit is None or head is None:
        pytest.skip("needs pre-commit and a git checkout whose HEAD has .pre-commit-hooks.yaml")
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PRE_COMMIT_COLOR": "never"}
    done = subprocess.run(
        [pre_commit, "try-repo", str(REPO), *args, "--ref", head],
        cwd=user_repo,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow
def test_hooks_block_a_risky_file_and_fix_it(user_repo: Path) -> None:
    # No hook id: both hooks run, sharing one installed environment.
    code, output = try_repo(user_repo, "--files", "risky.py", "clean.py", "legacy/old.py")
    assert code == 1, output
    check_part, fix_part = output.split("oom-lsp fix", 1)
    assert "oom-lsp check" in check_part and "Failed" in check_part
    assert "risky.py:2:9: OOM501" in check_part
    # legacy/old.py is risky too, but excluded: --force-exclude drops it
    # although pre-commit names it.
    assert "old.py" not in output
    assert "Failed" in fix_part and "files were modified by this hook" in fix_part
    assert (user_repo / "risky.py").read_text() == FIXED
    assert (user_repo / "legacy" / "old.py").read_text() == RISKY


@pytest.mark.slow
def test_check_hook_passes_clean_and_excluded_files(user_repo: Path) -> None:
    code, output = try_repo(user_repo, "oom-lsp-check", "--files", "clean.py", "legacy/old.py")
    assert code == 0, output
    assert "Passed" in output
