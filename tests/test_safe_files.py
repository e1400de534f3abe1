"""oom_lsp.safe_files and every writer that goes through it, each against symbolic links a
cloned repository commits where oom-lsp writes: the folder (`.oom_lsp/explain -> ~/...`),
the file itself (`report.json -> ~/.bashrc`) and a temporary file's fixed name
(`report.json.tmp -> ../../victim`). Nothing outside the project may change."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from types import SimpleNamespace

import pytest

from oom_lsp import safe_files
from oom_lsp.checker import ResultsCache, check_files, discover_files
from oom_lsp.config import ConfigResolver
from oom_lsp.estimate.whatif_record import RECORD_FOLDER, save_record
from oom_lsp.profiling.report import DeviceInfo, Report
from oom_lsp.profiling.runner import ProfileError, ProfileRequest, ProfileRun
from oom_lsp.usecases.budget import write_baseline
from tests.hostile_repo import snapshot

VICTIM_TEXT = "# the user's own file\n"
# OOM501 shown by default (Llama 2 7B's weights restored without map_location).
RISKY = (
    "import torch, transformers\n"
    'model = transformers.AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf").cuda()\n'
    'model.load_state_dict(torch.load("m.pt"))\n'
)


@pytest.fixture
def world(tmp_path: Path) -> dict[str, Path]:
    """A project and, beside it, the user's files that its links point at."""
    project, outside = tmp_path / "clone", tmp_path / "home"
    project.mkdir()
    outside.mkdir()
    (outside / ".bashrc").write_text(VICTIM_TEXT)
    (outside / "folder").mkdir()
    return {"project": project, "outside": outside, "root": tmp_path}


def link(path: Path, target: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(os.path.relpath(target, path.parent))
    return path


# --- The writer itself ---------------------------------------------------------------------------


def test_a_file_that_is_a_link_is_replaced_not_written_through(world):
    project, outside = world["project"], world["outside"]
    before = snapshot(outside)
    report = link(project / ".oom_lsp" / "profile" / "report.json", outside / ".bashrc")
    link(project / ".oom_lsp" / "profile" / "report.json.tmp", outside / ".bashrc")
    safe_files.write_file(report, "{}\n", root=project)
    assert not report.is_symlink() and report.read_text() == "{}\n"
    assert snapshot(outside) == before
    assert stat.S_IMODE(report.stat().st_mode) == 0o644


def test_a_folder_that_leads_out_is_refused_and_nothing_is_created_there(world):
    project, outside = world["project"], world["outside"]
    link(project / ".oom_lsp", outside / "folder")
    before = snapshot(outside)
    with pytest.raises(safe_files.LinkOutOfProject) as refused:
        safe_files.write_file(project / ".oom_lsp" / "explain" / "train.json", "{}", root=project)
    assert "outside the project" in str(refused.value) and ".oom_lsp" in str(refused.value)
    assert snapshot(outside) == before
    with pytest.raises(safe_files.LinkOutOfProject):
        safe_files.create_new(project / ".oom_lsp" / ".gitignore", "*\n", root=project)
    assert snapshot(outside) == before


def test_a_link_inside_the_project_is_followed_and_stays_a_link(world):
    project = world["project"]
    (project / "real").mkdir()
    (project / "real" / "train.py").write_text("x = 1\n")
    (project / "real" / "train.py").chmod(0o755)
    alias = link(project / "train.py", project / "real" / "train.py")
    safe_files.write_through(alias, "x = 2\n", root=project)
    assert alias.is_symlink() and (project / "real" / "train.py").read_text() == "x = 2\n"
    assert stat.S_IMODE((project / "real" / "train.py").stat().st_mode) == 0o755  # the mode is kept
    safe_files.write_file(project / "results" / "a.json", "1", root=project)
    link(project / "linked", project / "results")
    safe_files.write_file(project / "linked" / "b.json", "2", root=project)
    assert (project / "results" / "b.json").read_text() == "2"


def test_a_path_the_user_chose_outside_the_project_is_written(world):
    target = world["outside"] / "runs" / "report.json"
    safe_files.write_file(target, "{}", root=world["project"])
    assert target.read_text() == "{}"


def test_make_folder_says_what_it_created(world):
    project = world["project"]
    (project / ".oom_lsp").mkdir()
    created = safe_files.make_folder(project / ".oom_lsp" / "profile" / "run", project)
    assert created == [project / ".oom_lsp" / "profile", project / ".oom_lsp" / "profile" / "run"]
    assert safe_files.results_root(project / ".oom_lsp" / "profile" / "run") == project


# --- Every writer ----------------------------------------------------------------------------------


def test_the_results_cache(world):
    project, outside = world["project"], world["outside"]
    (project / "train.py").write_text(RISKY)
    link(project / ".oom_lsp_cache" / "CACHEDIR.TAG", outside / ".bashrc")
    before = snapshot(outside)
    run = check_files([project / "train.py"], ConfigResolver(fallback_root=project))
    assert [finding.code for finding in run.results[0].findings] == ["OOM501"]
    assert snapshot(outside) == before
    assert (project / ".oom_lsp_cache" / ".gitignore").is_file()
    # The whole folder a link out: nothing is cached, the check still answers.
    other = world["root"] / "other"
    other.mkdir()
    (other / "train.py").write_text(RISKY)
    link(other / ".oom_lsp_cache", outside / "folder")
    cache = ResultsCache(other)
    run = check_files([other / "train.py"], ConfigResolver(fallback_root=other))
    assert run.results[0].findings and snapshot(outside) == before
    assert cache.folder.parent.is_symlink()


def test_fix_does_not_follow_a_link_out_of_the_project(world):
    project, outside = world["project"], world["outside"]
    (outside / "shared.py").write_text(RISKY)
    link(project / "shared.py", outside / "shared.py")
    (project / "train.py").write_text(RISKY)
    before = snapshot(outside)
    resolver = ConfigResolver(fallback_root=project)
    files, notes = discover_files([project], resolver)
    assert files == [project / "train.py"]
    assert [note.notice for note in notes] == [
        f"not checked: a symbolic link to {outside / 'shared.py'}, outside the project"
    ]
    # Named on the command line (pre-commit passes every file): the same.
    files, notes = discover_files([project / "shared.py"], resolver)
    assert files == [] and notes[0].notice is not None
    run = check_files([project / "train.py"], resolver, fix=True, unsafe_fixes=True)
    assert run.results[0].changed
    assert snapshot(outside) == before


def test_fix_refuses_a_file_whose_folder_leads_out(world):
    """A file found by another way (an explicit file in a linked folder) is still not written."""
    project, outside = world["project"], world["outside"]
    (outside / "folder" / "train.py").write_text(RISKY)
    link(project / "vendor", outside / "folder")
    before = snapshot(outside)
    run = check_files([project / "vendor" / "train.py"], ConfigResolver(fallback_root=project), fix=True)
    (result,) = run.results
    assert result.error is not None and result.error.startswith("the fixes were not written: not written: ")
    assert snapshot(outside) == before


def test_the_what_if_record(world):
    project, outside = world["project"], world["outside"]
    link(project / RECORD_FOLDER.parent / ".gitignore", outside / ".bashrc")
    link(project / RECORD_FOLDER, outside / "folder")
    before = snapshot(outside)
    # The writer reads only the table's script and its JSON.
    table = SimpleNamespace(script=str(project / "train.py"), to_json=lambda: {"changes": []})
    save_record(project, table)  # type: ignore[arg-type]
    assert snapshot(outside) == before


def test_the_budget_baseline(world):
    project, outside = world["project"], world["outside"]
    link(project / "ci", outside / "folder")
    before = snapshot(outside)
    with pytest.raises(safe_files.LinkOutOfProject):
        write_baseline(project / "ci" / "baseline.json", {}, root=project)
    link(project / "baseline.json.tmp", outside / ".bashrc")
    write_baseline(project / "baseline.json", {"a.py": {"peak_bytes": 1}}, root=project)
    assert json.loads((project / "baseline.json").read_text())["scripts"] == {"a.py": {"peak_bytes": 1}}
    assert snapshot(outside) == before


def test_a_profile_report_and_its_folder(world, monkeypatch):
    project, outside = world["project"], world["outside"]
    monkeypatch.chdir(project)
    link(project / ".oom_lsp" / "profile" / "report.json.tmp", outside / ".bashrc")
    link(project / ".oom_lsp" / "validate", outside / "folder")
    before = snapshot(outside)
    Report(script="train.py", argv=[], status="completed", device=DeviceInfo("cpu")).write(
        project / ".oom_lsp" / "profile" / "report.json", root=project
    )
    assert snapshot(outside) == before
    run = ProfileRun(ProfileRequest(script=project / "train.py", out=Path(".oom_lsp/validate")))
    with pytest.raises(ProfileError) as refused:
        run.start()
    assert "cannot write the results to .oom_lsp/validate: not written: " in str(refused.value)
    assert snapshot(outside) == before


def test_the_guards_oom_report(world, monkeypatch):
    torch = pytest.importorskip("torch")
    from oom_lsp.runtime import oom_guard

    project, outside = world["project"], world["outside"]
    (project / "pyproject.toml").write_text("[project]\nname = 'demo'\n")
    link(project / ".oom_lsp" / "last_oom", outside / "folder")
    before = snapshot(outside)
    with pytest.raises(torch.OutOfMemoryError):
        with oom_guard(project_root=project, log=lambda message: None):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")
    assert snapshot(outside) == before
