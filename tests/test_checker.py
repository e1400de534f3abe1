"""Discovery, .gitignore semantics, decoding, cache keys and the process pool."""

from __future__ import annotations

from pathlib import Path

import pytest

from oom_lsp import checker
from oom_lsp.analysis.settings import LintSettings
from oom_lsp.config import ConfigResolver
from tests.samples import RISKY



def write(path: Path, text: str | bytes = RISKY) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("lines", "path", "is_dir", "ignored"),
    [
        (["*.py"], "a/b.py", False, True),
        (["build/"], "build", True, True),
        (["build/"], "build", False, None),  # a trailing slash matches folders only
        (["build/"], "src/build", True, True),  # ...at any depth
        (["/build"], "src/build", True, None),  # a leading slash anchors
        (["/build"], "build", True, True),
        (["docs/*.py"], "docs/conf.py", False, True),
        (["docs/*.py"], "src/docs/conf.py", False, None),  # an inner slash anchors too
        (["**/gen/*.py"], "x/y/gen/a.py", False, True),
        (["out/**"], "out/a/b.py", False, True),
        (["*.py", "!keep.py"], "keep.py", False, False),
        (["!keep.py", "*.py"], "keep.py", False, True),  # the last matching line wins
        (["\\#weird.py"], "#weird.py", False, True),
        (["# a comment", "", "   "], "a.py", False, None),
        (["name.py   "], "name.py", False, True),  # trailing spaces are dropped
    ],
)
def test_gitignore_semantics(
    lines: list[str], path: str, is_dir: bool, ignored: bool | None, tmp_path: Path
) -> None:
    ignore = checker.GitIgnore(tmp_path, lines)
    assert ignore.verdict(tmp_path / path, is_dir) is ignored


def test_nested_gitignore_overrides_its_parent(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    write(tmp_path / ".gitignore", "*_gen.py\n")
    write(tmp_path / "sub" / ".gitignore", "!keep_gen.py\n")
    write(tmp_path / ".git" / "info" / "exclude", "secret.py\n")
    for name in ("a_gen.py", "sub/keep_gen.py", "sub/other_gen.py", "secret.py", "sub/secret.py", "main.py"):
        write(tmp_path / name)
    files, missing = checker.discover_files([tmp_path], ConfigResolver(fallback_root=tmp_path))
    assert missing == []
    assert [file.relative_to(tmp_path).as_posix() for file in files] == ["main.py", "sub/keep_gen.py"]


def test_ancestor_gitignore_applies_inside_the_work_tree(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    write(tmp_path / ".gitignore", "generated/\n")
    write(tmp_path / "src" / "generated" / "a.py")
    write(tmp_path / "src" / "b.py")
    files, _ = checker.discover_files([tmp_path / "src"], ConfigResolver(fallback_root=tmp_path))
    assert [file.name for file in files] == ["b.py"]


def test_nested_pyproject_excludes_apply_to_its_folder(tmp_path: Path) -> None:
    write(tmp_path / "pkg" / "pyproject.toml", '[tool.oom-lsp]\nextend-exclude = ["vendored"]\n')
    write(tmp_path / "pkg" / "vendored" / "lib.py")
    write(tmp_path / "pkg" / "main.py")
    write(tmp_path / "vendored" / "kept.py")
    files, _ = checker.discover_files([tmp_path], ConfigResolver(fallback_root=tmp_path))
    assert sorted(file.relative_to(tmp_path).as_posix() for file in files) == [
        "pkg/main.py",
        "vendored/kept.py",
    ]


def test_notebooks_follow_include_and_exclude_as_python_files(tmp_path: Path) -> None:
    for name in ("train.py", "explore.ipynb", "legacy/old.ipynb", "legacy/old.py", "notes.txt"):
        write(tmp_path / name)
    write(tmp_path / ".ipynb_checkpoints" / "explore-checkpoint.ipynb")  # Jupyter's autosaves
    write(tmp_path / "pyproject.toml", '[tool.oom-lsp]\nextend-exclude = ["legacy"]\n')
    files, _ = checker.discover_files([tmp_path], ConfigResolver(fallback_root=tmp_path))
    assert [file.relative_to(tmp_path).as_posix() for file in files] == ["explore.ipynb", "train.py"]
    # `include` without notebooks leaves them out of folders, as it leaves out any other file.
    write(
        tmp_path / "pyproject.toml",
        '[tool.oom-lsp]\ninclude = ["*.py"]\nextend-include = ["legacy/*.ipynb"]\n',
    )
    files, _ = checker.discover_files([tmp_path], ConfigResolver(fallback_root=tmp_path))
    assert [file.relative_to(tmp_path).as_posix() for file in files] == [
        "legacy/old.ipynb",
        "legacy/old.py",
        "train.py",
    ]
    # A notebook named on the command line is checked, as any file named there.
    files, _ = checker.discover_files([tmp_path / "explore.ipynb"], ConfigResolver(fallback_root=tmp_path))
    assert [file.name for file in files] == ["explore.ipynb"]


def test_explicit_files_of_any_name_are_checked_once(tmp_path: Path) -> None:
    script = write(tmp_path / "train")  # a script without extension, as pre-commit may pass
    files, _ = checker.discover_files([script, script, tmp_path], ConfigResolver(fallback_root=tmp_path))
    assert files == [script]


@pytest.mark.parametrize(
    ("raw", "text", "problem"),
    [
        (b"x = 1\n", "x = 1\n", None),
        (b"\xef\xbb\xbfx = 1\n", "x = 1\n", None),
        (b"# coding: latin-1\nx = '\xe9'\n", "# coding: latin-1\nx = '\xe9'\n", None),
        (b"x = 1\r\ny = 2\r\n", "x = 1\r\ny = 2\r\n", None),
        (b"x = 1\ny = '\x00'\n", None, (2, 5, "source code cannot contain null bytes")),
        # A codec a package installs when imported (future_fstrings): the text is read as UTF-8.
        (b"# -*- coding: future_fstrings -*-\nx = f'{1}'\n", "# -*- coding: future_fstrings -*-\nx = f'{1}'\n", None),
        (b"# coding: klingon\nx = '\xff'\n", None, (1, 0, "unknown encoding: klingon")),
    ],
)
def test_decode_source(raw: bytes, text: str | None, problem: tuple[int, int, str] | None) -> None:
    decoded = checker.decode_source(raw)
    assert decoded.text == text
    if problem is None:
        assert decoded.problem is None
    else:
        assert decoded.problem is not None
        assert decoded.problem[:2] == problem[:2] and problem[2] in decoded.problem[2]


def test_undecodable_bytes_are_located() -> None:
    decoded = checker.decode_source("x = 'é'\ny = 1\nz = '".encode() + b"\xff'\n")
    assert decoded.text is None
    assert decoded.problem is not None
    line, column, message = decoded.problem
    assert (line, column) == (3, 5)
    assert "can't decode byte 0xff" in message


def test_cache_key_depends_on_content_settings_and_path() -> None:
    settings = LintSettings(frozenset({"OOM501"}))
    key = checker.cache_key(b"x", settings, "a.py")
    assert key == checker.cache_key(b"x", settings, "a.py")
    assert key != checker.cache_key(b"y", settings, "a.py")
    assert key != checker.cache_key(b"x", settings, "b.py")
    assert key != checker.cache_key(b"x", LintSettings(frozenset({"OOM000"})), "a.py")


def test_small_runs_stay_in_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(checker.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    settings = LintSettings(frozenset({"OOM501"}))
    small = [checker.Job(index, f"{index}.py", RISKY, settings, False, False) for index in range(50)]
    assert checker._worker_count(small) == 1
    large = [checker.Job(index, f"{index}.py", RISKY * 4000, settings, False, False) for index in range(8)]
    assert checker._worker_count(large) == 4
    assert checker._worker_count(large[:3]) == 1  # too few files to split


def test_process_pool_gives_the_same_results(tmp_path: Path) -> None:
    for index in range(6):
        write(tmp_path / f"script_{index}.py", RISKY * (index + 1))
    write(tmp_path / "broken.py", "import torch\ndef f(:\n")
    resolver = ConfigResolver(overrides={"select": ["OOM000", "OOM501"]}, fallback_root=tmp_path)
    files, _ = checker.discover_files([tmp_path], resolver)
    serial = checker.check_files(files, resolver, use_cache=False, workers=1)
    parallel = checker.check_files(files, resolver, use_cache=False, workers=2)
    assert [result.findings for result in parallel.results] == [result.findings for result in serial.results]
    assert [len(result.findings) for result in serial.results] == [1, 1, 2, 3, 4, 5, 6]
    assert parallel.analyzed == len(files)
