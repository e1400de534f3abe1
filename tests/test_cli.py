"""`oom-lsp` driven in-process through main([...]), plus a few runs of the
installed console script."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

from oom_lsp import cli
from oom_lsp.analysis import engine
from tests.samples import FIXED, RISKY

CLEAN = "import torch\nx = torch.zeros(3)\n"
# OOM101's fix (lowering the batch size) is unsafe.
BIG_BATCH = "from torch.utils.data import DataLoader\nloader = DataLoader(data, batch_size=256)\n"
# Only rules whose behaviour these tests rely on; other rules are tested elsewhere.
SELECT = ["--select", "OOM000,OOM501"]
VENV_BIN = Path(sys.executable).parent


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def feed_stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))


# --- exit codes and the two spellings ------------------------------------------------------------------


def test_clean_exits_0(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "clean.py", CLEAN)
    code, out, err = run(capsys, "--check", *SELECT, "clean.py")
    assert (code, out, err) == (0, "All checks passed!\n", "")


def test_findings_exit_1_both_spellings(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "risky.py", RISKY)
    for argv in (
        ["--check", *SELECT, "risky.py"],
        ["check", *SELECT, "risky.py"],
        [*SELECT, "--check", "risky.py"],
    ):
        code, out, _ = run(capsys, *argv)
        assert code == 1
        assert out.splitlines()[0].startswith("risky.py:2:9: OOM501 [*] ")
        assert out.splitlines()[-2:] == ["Found 1 error.", "[*] 1 fixable with the `--fix` option."]


def test_check_flag_only_among_leading_options(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli._normalize_argv(["--check", "a.py"]) == ["check", "a.py"]
    assert cli._normalize_argv(["--select", "OOM501", "--check", "a.py"]) == [
        "check",
        "--select",
        "OOM501",
        "a.py",
    ]
    assert cli._normalize_argv(["profile", "train.py", "--", "--check"]) == [
        "profile",
        "train.py",
        "--",
        "--check",
    ]
    assert cli._normalize_argv([]) == ["server"]
    assert cli._normalize_argv(["--stdio"]) == ["server", "--stdio"]


def test_exit_zero(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "risky.py", RISKY)
    code, out, _ = run(capsys, "--check", *SELECT, "--exit-zero", "risky.py")
    assert code == 0 and "OOM501" in out


def test_default_path_is_the_current_folder(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "pkg" / "risky.py", RISKY)
    code, out, _ = run(capsys, "--check", *SELECT)
    assert code == 1 and out.startswith(os.path.join("pkg", "risky.py") + ":2:9:")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--check", "--select", "OOM999", "."], "error: --select: unknown rule selector 'OOM999'\n"),
        (["--check", "--ignore", "E501", "."], "error: --ignore: unknown rule selector 'E501'\n"),
        (["--check", "--config", "missing.toml", "."], "error: missing.toml: no such configuration file\n"),
        (["--check", "a.py", "-"], "error: `-` (stdin) cannot be combined with other paths\n"),
        (["--check", "--format", "xml", "."], "invalid choice: 'xml'"),
        (["--check", "--no-such-flag", "."], "unrecognized arguments: --no-such-flag"),
        (["rule"], "error: give either a rule (code or name) or --all\n"),
        (["rule", "OOM999"], "error: unknown rule 'OOM999'"),
        (["server", "--tcp", "nonsense"], "expected HOST:PORT"),
        # An empty selection (an unset shell variable) would check nothing and pass.
        (["--check", "--select", "", "."], "argument --select: expected rule codes, prefixes or names"),
        (["--check", "--ignore", " , ", "."], "argument --ignore: expected rule codes, prefixes or names"),
        (["--check", "--estimate-timeout", "-1", "."], "expected a positive number of seconds, got '-1'"),
        (["estimate", "a.py", "--timeout", "-1"], "argument --timeout: expected a positive number of seconds, got '-1'"),
        (["estimate", "a.py", "--timeout", "nan"], "argument --timeout: expected a positive number of seconds, got 'nan'"),
        (["profile", "a.py", "--timeout", "0"], "argument --timeout: expected a positive number of seconds, got '0'"),
        (["validate", "a.py", "--timeout", "-5"], "argument --timeout: expected a positive number of seconds, got '-5'"),
    ],
)
def test_usage_errors_exit_2_without_traceback(
    project: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, *argv)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and out == ""


def test_broken_config_exits_2_naming_file_and_key(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "risky.py", RISKY)
    write(project / "pyproject.toml", '[tool.oom-lsp]\nselect = ["OOM501"]\nmax-batch-size = "big"\n')
    code, out, err = run(capsys, "--check", "risky.py")
    assert code == 2 and out == ""
    assert (
        err
        == "error: pyproject.toml: [tool.oom-lsp] max-batch-size: expected a positive integer, got 'big'\n"
    )
    write(project / "pyproject.toml", "[tool.oom-lsp]\nselect = [OOM501]\n")
    code, _, err = run(capsys, "--check", "risky.py")
    assert code == 2 and err.startswith("error: pyproject.toml: invalid TOML: ") and "line" in err
    write(project / "pyproject.toml", "[tool.oom-lsp]\nselct = []\n")
    code, _, err = run(capsys, "--check", "risky.py")
    assert code == 2 and "selct: unknown key; did you mean 'select'?" in err


def test_pyproject_configures_and_cli_flags_override(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project / "risky.py", RISKY)
    write(project / "tests" / "test_load.py", RISKY)
    write(
        project / "pyproject.toml",
        '[tool.oom-lsp]\nselect = ["OOM501"]\n[tool.oom-lsp.per-file-ignores]\n"tests/**" = ["OOM501"]\n'
        '[tool.oom-lsp.severity]\nOOM5 = "error"\n',
    )
    code, out, _ = run(capsys, "--check", "--format", "json", ".")
    records = json.loads(out)
    assert code == 1
    assert [(record["path"], record["severity"]) for record in records] == [("risky.py", "error")]
    code, out, _ = run(capsys, "--check", "--ignore", "OOM501", ".")
    assert (code, out) == (0, "All checks passed!\n")
    other = write(project / "ci.toml", 'select = ["OOM000"]\n')
    code, _, _ = run(capsys, "--check", "--config", str(other), ".")
    assert code == 0


# --- stdin --------------------------------------------------------------------------------------------------


def test_stdin_with_and_without_filename(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    feed_stdin(monkeypatch, RISKY.encode())
    code, out, _ = run(capsys, "--check", *SELECT, "-")
    assert code == 1 and out.startswith("-:2:9: OOM501")
    feed_stdin(monkeypatch, RISKY.encode())
    code, out, _ = run(capsys, "--check", *SELECT, "--stdin-filename", "src/train.py", "-")
    assert code == 1 and out.startswith(os.path.join("src", "train.py") + ":2:9: OOM501")


def test_stdin_filename_selects_the_config(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write(project / "pyproject.toml", '[tool.oom-lsp]\nper-file-ignores = { "scripts/*" = ["OOM501"] }\n')
    feed_stdin(monkeypatch, RISKY.encode())
    code, out, _ = run(capsys, "--check", *SELECT, "--stdin-filename", "scripts/load.py")
    assert (code, out) == (0, "All checks passed!\n")


def test_stdin_fix_writes_the_fixed_source(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    feed_stdin(monkeypatch, RISKY.encode())
    code, out, err = run(capsys, "--check", *SELECT, "--fix", "-")
    assert out == FIXED
    assert code == 0 and "1 fixed, 0 remaining" in err


def test_stdin_diff(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    feed_stdin(monkeypatch, RISKY.encode())
    code, out, _ = run(capsys, "--check", *SELECT, "--diff", "-")
    assert code == 1 and '+state = torch.load("x.pt", map_location="cpu")' in out


# --- fixes --------------------------------------------------------------------------------------------------------


def test_fix_writes_files_and_reports(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    risky = write(project / "risky.py", RISKY)
    clean = write(project / "clean.py", CLEAN)
    code, out, _ = run(capsys, "--check", *SELECT, "--fix", "--show-fixes", ".")
    assert code == 0
    assert risky.read_text() == FIXED and clean.read_text() == CLEAN
    assert "Fixed 1 error:\n- risky.py:\n    1 × OOM501 (torch-load-without-map-location)\n" in out
    assert out.endswith("Found 1 error (1 fixed, 0 remaining).\n")
    code, out, _ = run(capsys, "--check", *SELECT, "--fix", ".")
    assert (code, out) == (0, "All checks passed!\n")


def test_fix_exit_non_zero_on_fix(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "risky.py", RISKY)
    code, _, _ = run(capsys, "--check", *SELECT, "--fix", "--exit-non-zero-on-fix", "risky.py")
    assert code == 1
    code, _, _ = run(capsys, "--check", *SELECT, "--fix", "--exit-non-zero-on-fix", "risky.py")
    assert code == 0


def test_fix_keeps_encoding_bom_and_newlines(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    crlf = write(project / "crlf.py", RISKY.replace("\n", "\r\n").encode())
    bom = write(project / "bom.py", b"\xef\xbb\xbf" + RISKY.encode())
    latin = write(project / "latin.py", b"# -*- coding: latin-1 -*-\n# caf\xe9\n" + RISKY.encode())
    code, _, _ = run(capsys, "--check", *SELECT, "--fix", ".")
    assert code == 0
    assert crlf.read_bytes() == FIXED.replace("\n", "\r\n").encode()
    assert bom.read_bytes() == b"\xef\xbb\xbf" + FIXED.encode()
    assert latin.read_bytes() == b"# -*- coding: latin-1 -*-\n# caf\xe9\n" + FIXED.encode()


def test_unsafe_fixes_only_on_request(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = write(project / "train.py", BIG_BATCH)
    # A batch literal with no size facts around it is reported in strict mode only.
    select = ["--strict", "--select", "OOM101"]
    code, out, _ = run(capsys, "--check", *select, ".")
    assert code == 1
    assert "OOM101 [*]" not in out
    assert "No fixes available (1 hidden fix can be enabled with the `--unsafe-fixes` option)." in out
    code, out, _ = run(capsys, "--check", *select, "--unsafe-fixes", ".")
    assert "OOM101 [*]" in out and "[*] 1 fixable with the `--fix` option." in out
    code, _, _ = run(capsys, "--check", *select, "--fix", ".")
    assert code == 1 and script.read_text() == BIG_BATCH
    code, _, _ = run(capsys, "--check", *select, "--fix", "--unsafe-fixes", ".")
    assert code == 0 and "batch_size=32" in script.read_text()


def test_diff_shows_but_does_not_write(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    risky = write(project / "risky.py", RISKY)
    code, out, err = run(capsys, "--check", *SELECT, "--diff", ".")
    assert code == 1
    assert out.splitlines()[:2] == ["--- risky.py", "+++ risky.py"]
    assert '-state = torch.load("x.pt")' in out and '+state = torch.load("x.pt", map_location="cpu")' in out
    assert err == "Would fix 1 error.\n"
    assert risky.read_text() == RISKY
    risky.write_text(FIXED)
    code, out, _ = run(capsys, "--check", *SELECT, "--diff", ".")
    assert (code, out) == (0, "")


def test_diff_numbers_lines_as_python_does_below_a_form_feed(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = "import torch, transformers\n"
    write(project / "paged.py", RISKY.replace(first, first + "# page \x0c break\n"))
    code, out, _ = run(capsys, "--check", *SELECT, "--diff", ".")
    assert code == 1
    assert out.split("\n")[2:5] == ["@@ -1,5 +1,5 @@", " import torch, transformers", " # page \x0c break"]


# --- outputs through the CLI ------------------------------------------------------------------------------------------


def test_json_and_statistics(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "a.py", RISKY)
    write(project / "b.py", RISKY + 'more = torch.load("y.pt")\nnet.load_state_dict(more["net"])\n')
    code, out, _ = run(capsys, "--check", *SELECT, "--format", "json", ".")
    records = json.loads(out)
    assert code == 1 and [(r["path"], r["line"]) for r in records] == [("a.py", 2), ("b.py", 2), ("b.py", 5)]
    code, out, _ = run(capsys, "--check", *SELECT, "--statistics", ".")
    assert out.splitlines()[0] == "3\tOOM501\t[*] torch-load-without-map-location"
    code, out, _ = run(capsys, "--check", *SELECT, "--statistics", "--format", "json", ".")
    assert json.loads(out) == [
        {"code": "OOM501", "name": "torch-load-without-map-location", "count": 3, "fixable": True}
    ]


def test_quiet_and_full(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "a.py", RISKY)
    code, out, _ = run(capsys, "--check", *SELECT, "-q", ".")
    assert code == 1 and len(out.splitlines()) == 1
    code, out, _ = run(capsys, "--check", *SELECT, "--format", "full", ".")
    assert " --> a.py:2:9" in out and '2 | state = torch.load("x.pt")' in out and "help: " in out


# --- files ---------------------------------------------------------------------------------------------------------------


def test_empty_file_list_exits_0_silently(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / "empty").mkdir()
    write(project / "docs" / "notes.txt", "torch.load('x')")
    assert run(capsys, "--check", "empty", "docs") == (0, "", "")


def test_special_files_never_crash(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "a_binary.py", b"import torch\x00\x01\x02")
    write(project / "b_latin1.py", b"# caf\xe9\nimport torch\n")
    write(project / "c_empty.py", "")
    write(project / "d_syntax.py", "import torch\ndef broken(:\n")
    write(project / "e_risky.py", RISKY)
    code, out, err = run(capsys, "--check", *SELECT, "--no-cache", ".")
    assert code == 1 and err == ""
    lines = out.splitlines()
    assert lines[0] == "a_binary.py:1:13: OOM000 SyntaxError: source code cannot contain null bytes"
    assert lines[1].startswith(
        "b_latin1.py:1:6: OOM000 SyntaxError: (unicode error) 'utf-8' codec can't decode byte 0xe9"
    )
    assert lines[2].startswith("d_syntax.py:2:") and " OOM000 SyntaxError: " in lines[2]
    assert lines[3].startswith("e_risky.py:2:9: OOM501")
    assert "c_empty.py" not in out


def test_unreadable_and_missing_files_are_reported_and_the_run_goes_on(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write(project / "risky.py", RISKY)
    locked = write(project / "locked.py", RISKY)
    real_read_bytes = Path.read_bytes

    def read_bytes(path: Path) -> bytes:
        if path.name == "locked.py":  # chmod 0 does not stop root
            raise PermissionError(13, "Permission denied", str(path))
        return real_read_bytes(path)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    code, out, err = run(capsys, "--check", *SELECT, "locked.py", "risky.py", "missing.py")
    assert code == 1
    assert "error: locked.py: Permission denied\n" in err
    assert "error: missing.py: No such file or directory\n" in err
    assert out.startswith("risky.py:2:9: OOM501")
    assert locked.exists()
    code, out, _ = run(capsys, "--check", *SELECT, "locked.py")
    assert (code, out) == (1, "No findings, but 1 file could not be checked.\n")


def test_an_unreadable_folder_is_reported_and_the_rest_is_checked(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A folder without read and search permission, as the kernel treats one for a
    user who is not root (root, who runs this suite, ignores the mode bits)."""
    write(project / "a_ok" / "risky.py", RISKY)
    locked = project / "b_locked"
    write(locked / "hidden.py", RISKY)
    write(project / "c_ok" / "risky.py", RISKY)
    real_scandir, real_stat = os.scandir, Path.stat

    def scandir(path: object = ".") -> object:
        if Path(os.fspath(path)).absolute() == locked.absolute():
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_scandir(path)

    def stat(path: Path, *args: object, **kwargs: object) -> os.stat_result:
        if locked.absolute() in path.absolute().parents:
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(Path, "stat", stat)
    code, out, err = run(capsys, "--check", *SELECT, "--no-cache", ".")
    assert code == 1
    assert "error: b_locked: cannot list the folder: Permission denied\n" in err
    assert "Traceback" not in err
    assert [line.split(":")[0] for line in out.splitlines() if "OOM501" in line] == [
        os.path.join("a_ok", "risky.py"),
        os.path.join("c_ok", "risky.py"),
    ]


def test_a_file_over_max_file_size_is_reported_and_the_others_checked(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write(project / "pyproject.toml", '[tool.oom-lsp]\nmax-file-size = "4KiB"\n')
    write(project / "big.py", RISKY + "x = 1\n" * 2000)
    write(project / "small.py", RISKY)
    code, out, err = run(capsys, "--check", *SELECT, "--no-cache", ".")
    assert code == 1
    assert (
        "error: big.py: not checked: 11.9 KiB is over max-file-size (4 KiB); raise max-file-size in "
        "[tool.oom-lsp] to check it\n"
    ) in err
    assert out.startswith("small.py:2:9: OOM501")
    feed_stdin(monkeypatch, (RISKY + "x = 1\n" * 2000).encode())
    code, _, err = run(capsys, "--check", *SELECT, "--stdin-filename", "big.py", "-")
    assert code == 1 and "not checked: 11.9 KiB is over max-file-size" in err


def test_tokenizer_errors_are_placed_where_python_places_them(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write(project / "open_string.py", 'import torch\nx = 1\ns = "abc\ny = 2\n')
    write(project / "dedent.py", "import torch\nif x:\n        a = 1\n    b = 2\n")
    code, out, _ = run(capsys, "--check", *SELECT, "--no-cache", ".")
    assert code == 1
    assert out.splitlines()[:2] == [
        "dedent.py:4:10: OOM000 SyntaxError: unindent does not match any outer indentation level",
        "open_string.py:3:5: OOM000 SyntaxError: unterminated string literal (detected at line 3)",
    ]


def test_a_crash_on_one_file_is_reported_and_the_others_are_checked(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_analyze = engine.analyze

    def analyze(source: str, settings: object, path: str = "<stdin>") -> list:
        if path.endswith("crash.py"):
            raise AttributeError("'Rule' object has no attribute 'state'")
        return real_analyze(source, settings, path)

    monkeypatch.setattr(engine, "analyze", analyze)
    write(project / "crash.py", RISKY)
    write(project / "risky.py", RISKY)
    code, out, err = run(capsys, "--check", *SELECT, ".")
    assert code == 2
    assert out.startswith("risky.py:2:9: OOM501")
    assert err.startswith("error: crash.py: oom-lsp failed while checking this file (AttributeError: ")
    assert "This is a bug in oom-lsp" in err and "Traceback" not in err
    code, _, err = run(capsys, "--check", *SELECT, "-v", "crash.py")
    assert code == 2 and "Traceback (most recent call last)" in err  # -v shows it
    monkeypatch.setattr(engine, "analyze", real_analyze)
    code, _, _ = run(capsys, "--check", *SELECT, "crash.py")
    assert code == 1, "a crash is never cached"


def test_gitignore_and_exclude(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (project / ".git").mkdir()
    write(project / ".gitignore", "generated/\n*_tmp.py\n!keep_tmp.py\n/rootonly.py\n")
    write(project / "src" / ".gitignore", "local.py\n")
    for name in (
        "main.py",
        "generated/model.py",
        "src/scratch_tmp.py",
        "src/keep_tmp.py",
        "rootonly.py",
        "src/rootonly.py",
        "src/local.py",
        ".venv/lib/site.py",
        "build/lib/x.py",
        "legacy/old.py",
        "stubs/types.pyi",
    ):
        write(project / name, RISKY)
    write(project / "pyproject.toml", '[tool.oom-lsp]\nselect = ["OOM501"]\nextend-exclude = ["legacy"]\n')
    code, out, _ = run(capsys, "--check", "-q", "--no-cache", ".")
    checked = sorted({line.split(":")[0] for line in out.splitlines()})
    assert checked == sorted(
        os.path.normpath(name)
        for name in ("main.py", "src/keep_tmp.py", "src/rootonly.py", "stubs/types.pyi")
    )
    # Named explicitly, an excluded file is checked unless --force-exclude.
    code, out, _ = run(capsys, "--check", "-q", "legacy/old.py")
    assert code == 1
    assert run(capsys, "--check", "-q", "--force-exclude", "legacy/old.py") == (0, "", "")
    assert run(capsys, "--check", "-q", "--force-exclude", ".venv/lib/site.py") == (0, "", "")
    write(project / "pyproject.toml", '[tool.oom-lsp]\nselect = ["OOM501"]\nrespect-gitignore = false\n')
    code, out, _ = run(capsys, "--check", "-q", "--no-cache", ".")
    assert os.path.join("generated", "model.py") in out


# --- cache ------------------------------------------------------------------------------------------------------------------


def test_cache_hit_does_not_reanalyse(
    project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_analyze = engine.analyze

    def counting_analyze(source: str, settings: object, path: str = "<stdin>") -> list:
        calls.append(path)
        return real_analyze(source, settings, path)

    monkeypatch.setattr(engine, "analyze", counting_analyze)
    risky = write(project / "risky.py", RISKY)
    write(project / "clean.py", CLEAN)
    first = run(capsys, "--check", *SELECT, "-v", ".")
    assert len(calls) == 2
    assert "2 analysed, 0 from the cache" in first[2]
    second = run(capsys, "--check", *SELECT, "-v", ".")
    assert len(calls) == 2, "the second run must come from the cache"
    assert "0 analysed, 2 from the cache" in second[2]
    assert second[:2] == first[:2]
    assert (project / ".oom_lsp_cache" / ".gitignore").read_text().endswith("*\n")
    # Other settings, changed content, or --no-cache: analysed again.
    run(capsys, "--check", "--select", "OOM501", ".")
    assert len(calls) == 4
    risky.write_text(RISKY + "# edited\n")
    run(capsys, "--check", *SELECT, ".")
    assert calls[4:] == [str(risky)]
    run(capsys, "--check", *SELECT, "--no-cache", ".")
    assert len(calls) == 7


def test_cache_forgets_deleted_files(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "risky.py", RISKY)
    gone = write(project / "gone.py", RISKY)
    run(capsys, "--check", *SELECT, ".")
    gone.unlink()
    write(project / "new.py", RISKY)
    run(capsys, "--check", *SELECT, ".")
    (cache_file,) = (project / ".oom_lsp_cache").rglob("*.json")
    assert sorted(json.loads(cache_file.read_text())["entries"]) == ["new.py", "risky.py"]


def test_no_cache_writes_nothing(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "risky.py", RISKY)
    run(capsys, "--check", *SELECT, "--no-cache", ".")
    assert not (project / ".oom_lsp_cache").exists()


def test_corrupt_cache_is_ignored(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write(project / "risky.py", RISKY)
    run(capsys, "--check", *SELECT, ".")
    cache_files = list((project / ".oom_lsp_cache").rglob("*.json"))
    assert len(cache_files) == 1
    cache_files[0].write_text("{not json")
    code, out, _ = run(capsys, "--check", *SELECT, ".")
    assert code == 1 and "OOM501" in out


# --- rule ----------------------------------------------------------------------------------------------------------------------


def test_rule_docs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "rule", "OOM501")
    assert code == 0
    assert out.startswith("# torch-load-without-map-location (OOM501)\n")
    for section in (
        "## What it does",
        "## Why is this bad?",
        "## Example",
        "## Use instead",
        "## Fix safety",
    ):
        assert section in out
    assert run(capsys, "rule", "torch-load-without-map-location")[1] == out
    assert run(capsys, "rule", "oom501")[1] == out
    code, out, _ = run(capsys, "rule", "OOM501", "--format", "json")
    assert json.loads(out)["code"] == "OOM501"


def test_rule_all_json(capsys: pytest.CaptureFixture[str]) -> None:
    from oom_lsp.analysis import registry

    code, out, _ = run(capsys, "rule", "--all", "--format", "json")
    rules = json.loads(out)
    assert code == 0
    assert [rule["code"] for rule in rules] == registry.all_codes()
    for rule in rules:
        assert set(rule) == {
            "code",
            "name",
            "summary",
            "severity",
            "default_enabled",
            "fix",
            "explanation",
            "url",
        }
        assert rule["explanation"].startswith(f"# {rule['name']} ({rule['code']})")
    by_code = {rule["code"]: rule for rule in rules}
    assert by_code["OOM501"]["fix"] == "safe" and by_code["OOM000"]["fix"] is None
    assert by_code["OOM900"]["default_enabled"] is False
    code, out, _ = run(capsys, "rule", "--all")
    headings = re.findall(r"^# [a-z0-9-]+ \((OOM\d{3})\)$", out, re.MULTILINE)
    assert headings == [rule["code"] for rule in rules]


# --- server and feature commands ------------------------------------------------------------------------------------------------


def test_server_is_started_with_its_options(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[tuple[str | None, str | None]] = []
    fake = types.ModuleType("oom_lsp.server")
    fake.start_server = lambda tcp, log_file: started.append((tcp, log_file)) or 0  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "oom_lsp.server", fake)
    assert run(capsys, "server", "--tcp", "127.0.0.1:2087", "--log-file", "s.log")[0] == 0
    assert run(capsys)[0] == 0  # no arguments: the server over stdio
    assert run(capsys, "--stdio")[0] == 0  # what vscode-languageclient passes
    assert started == [("127.0.0.1:2087", "s.log"), (None, None), (None, None)]


def test_server_missing_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "oom_lsp.server", types.ModuleType("oom_lsp.server"))
    code, _, err = run(capsys, "server")
    assert code == 2 and err.startswith("error: the language server is not available")


def test_feature_commands_plug_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    write(
        tmp_path / "oom_test_feature.py",
        "def add_parsers(subparsers):\n"
        "    parser = subparsers.add_parser('hello', help='say hello')\n"
        "    parser.add_argument('--name', default='world')\n"
        "    parser.set_defaults(handler=lambda args: print('hello', args.name) or 3)\n",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cli, "FEATURE_COMMANDS", ("oom_test_feature", "not_installed.anywhere"))
    assert run(capsys, "hello", "--name", "you") == (3, "hello you\n", "")
    assert "say hello" in run(capsys, "--help")[1]


# --- the installed console script --------------------------------------------------------------------------------------------------


def test_console_script_entry_point(project: Path) -> None:
    write(project / "risky.py", RISKY)
    write(project / "clean.py", CLEAN)
    script = VENV_BIN / "oom-lsp"
    risky = subprocess.run(
        [str(script), "--check", *SELECT, "risky.py"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert risky.returncode == 1 and "risky.py:2:9: OOM501" in risky.stdout
    clean = subprocess.run(
        [str(script), "check", *SELECT, "clean.py"], capture_output=True, text=True, timeout=120, check=False
    )
    assert (clean.returncode, clean.stdout) == (0, "All checks passed!\n")
    version = subprocess.run(
        [str(script), "--version"], capture_output=True, text=True, timeout=120, check=False
    )
    assert version.stdout.startswith("oom-lsp ")


def test_check_imports_neither_pygls_lsprotocol_torch_nor_detect_secrets(project: Path) -> None:
    write(project / "risky.py", RISKY)
    probe = (
        "import sys\n"
        "from oom_lsp.cli import main\n"
        "code = main(['--check', '--no-cache', '--format', 'json', 'risky.py'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pygls', 'lsprotocol', 'torch', 'detect_secrets'))\n"
        "print('HEAVY', heavy, code, file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert "HEAVY [] 1" in done.stderr, done.stderr
    assert json.loads(done.stdout)


# --- a broken configuration, for every command that reads it (the console script) ---------------------

BROKEN_CONFIGS = {
    "bad-value": ('[tool.oom-lsp]\ngpu-memory = "lots"\n', 'pyproject.toml: [tool.oom-lsp] gpu-memory: '),
    "bad-toml": ("[tool.oom-lsp\n", "pyproject.toml: invalid TOML: "),
}
READS_THE_CONFIG = {
    "check": ["--check", "train.py"],
    "estimate": ["estimate", "train.py"],
    "estimate-gpu-memory": ["estimate", "train.py", "--gpu-memory", "8GiB"],
    "validate": ["validate", "train.py", "--before", "before.json"],
    "prompt": ["prompt", "train.py"],
    "fix": ["fix", "--ai", "train.py"],
}


@pytest.mark.parametrize("config", sorted(BROKEN_CONFIGS))
@pytest.mark.parametrize("command", sorted(READS_THE_CONFIG))
def test_a_broken_configuration_is_one_line_and_exit_2(tmp_path: Path, command: str, config: str) -> None:
    from tests import console

    text, message = BROKEN_CONFIGS[config]
    write(tmp_path / "pyproject.toml", text)
    write(tmp_path / "train.py", RISKY)
    write(tmp_path / "before.json", json.dumps({"script": "train.py", "peak_bytes": 1, "device": "cpu"}))
    result = console.run(READS_THE_CONFIG[command], tmp_path, timeout=120)
    assert result.returncode == 2, result
    (line,) = result.stderr.splitlines()
    assert message in line and line.startswith(("error: ", "oom-lsp")), line


# --- syntax errors in files that mention no framework (the console script) --------------------------


def test_a_syntax_error_is_reported_in_a_file_that_mentions_no_framework(tmp_path: Path) -> None:
    from tests import console

    write(tmp_path / "helpers.py", "def f(:\n    return 1\n")
    write(tmp_path / "unclosed.py", "values = (1,\n")
    write(tmp_path / "fine.py", "def f(x):\n    return x\n")
    # Rejected by CPython's compiler, accepted by libcst (as for a file that mentions torch): no finding.
    write(tmp_path / "outside.py", "return 1\n")
    result = console.run(["--check", "--no-cache", "."], tmp_path)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "helpers.py:1:7: OOM000 SyntaxError: invalid syntax",
        "unclosed.py:1:10: OOM000 SyntaxError: '(' was never closed",
        "Found 2 errors.",
    ]


# --- --fix: one count in every line of its output; --fix --diff (the console script) -----------------

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def _count(pattern: str, text: str) -> int:
    match = re.search(pattern, text, re.MULTILINE)
    assert match, (pattern, text[-500:])
    return int(match.group(1))


def test_fix_counts_agree_in_one_output(tmp_path: Path) -> None:
    from tests import console

    for fixture in FIXTURES.glob("*.py"):
        write(tmp_path / fixture.name, fixture.read_text())
    found = _count(r"^Found (\d+) errors\.$", console.run(["--check", "--no-cache", "."], tmp_path).stdout)
    out = console.run(["--check", "--no-cache", "--fix", "--show-fixes", "."], tmp_path).stdout
    listed = _count(r"^Fixed (\d+) errors:$", out)
    per_code = sum(int(count) for count in re.findall(r"^    (\d+) × OOM\d+ ", out, re.MULTILINE))
    summary = re.search(r"^Found (\d+) errors \((\d+) fixed, (\d+) remaining\)\.$", out, re.MULTILINE)
    assert summary, out[-500:]
    total, fixed, remaining = map(int, summary.groups())
    assert listed == per_code == fixed > 0
    # As Ruff counts: the fixed ones plus what a check finds after the fixes. A fix can make a
    # finding of another rule (OOM401's list of batches is OOM306's GPU outputs kept over the
    # loader), so the total may exceed the first check's, never fall below the fixed ones.
    assert total == fixed + remaining
    assert found <= total <= found + fixed
    again = console.run(["--check", "--no-cache", "."], tmp_path).stdout
    assert _count(r"^Found (\d+) errors\.$", again) == remaining


def test_fix_diff_prints_what_fix_would_write_and_writes_nothing(tmp_path: Path) -> None:
    from tests import console

    script = write(tmp_path / "train.py", RISKY)
    result = console.run(["--check", "--no-cache", "--fix", "--diff", "train.py"], tmp_path)
    assert result.returncode == 1
    assert '+state = torch.load("x.pt", map_location="cpu")' in result.stdout.splitlines()
    assert result.stderr == "Would fix 1 error.\n"
    assert script.read_text() == RISKY


# --- bare `oom-lsp` in a terminal (the console script on a pseudo-terminal) ----------------------------


@pytest.mark.serial  # a signal mid-run: the serial pass
@pytest.mark.parametrize(("target", "presses"), [("group", 1), ("group", 2), ("process", 1)])
def test_the_server_in_a_terminal_says_what_it_is_and_quits_on_ctrl_c(
    tmp_path: Path, target: str, presses: int
) -> None:
    import pty
    import select
    import signal
    import time

    from tests import console

    master, slave = pty.openpty()
    server = subprocess.Popen(
        [console.OOM_LSP], cwd=tmp_path, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    screen = b""
    try:
        deadline = time.monotonic() + 60
        while b"Ctrl-C quits." not in screen:
            assert time.monotonic() < deadline, screen
            if select.select([master], [], [], 0.2)[0]:
                screen += os.read(master, 4096)
        # Typed (pasted) into the terminal: once it is answered, the server is serving, its
        # reader thread blocked on the terminal, not still importing its modules.
        body = json.dumps(
            {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"processId": None, "capabilities": {}}}
        ).encode()
        os.write(master, b"Content-Length: %d\r\n\r\n%s\n" % (len(body), body))
        while b'"result"' not in screen:
            assert time.monotonic() < deadline, screen
            if select.select([master], [], [], 0.2)[0]:
                screen += os.read(master, 4096)
        for _ in range(presses):  # once, or twice as an impatient person does
            if target == "group":
                os.killpg(server.pid, signal.SIGINT)
            else:
                server.send_signal(signal.SIGINT)
            time.sleep(0.3)
        assert server.wait(timeout=30) == 130
        while select.select([master], [], [], 0.2)[0]:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                break
            if not chunk:
                break
            screen += chunk
    finally:
        os.close(master)
        if server.poll() is None:
            server.kill()
    text = screen.decode()
    assert text.startswith("oom-lsp: this is the oom-lsp language server, waiting for an editor")
    assert "oom-lsp --check PATH" in text and "oom-lsp --help" in text
    assert "Fatal Python error" not in text
