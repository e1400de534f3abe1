"""`oom-lsp prompt`, `fix --ai` and `validate` through oom_lsp.cli.main, against the
loopback model server. A bad answer never changes the user's file."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path
from typing import Any

import pytest

from oom_lsp import cli
from oom_lsp.llm import fixlog
from oom_lsp.profiling.report import read_report
from tests.conftest import UserConfigWriter
from tests.llm.conftest import (
    AMBIGUOUS_ANSWER,
    BROKEN_ANSWER,
    FIXED_LINE,
    GARBAGE,
    GOOD_ANSWER,
    NO_MATCH_ANSWER,
    TARGET_LINE,
    TRAIN,
)
from tests.llm.fake_server import FakeModelServer

ROOT = Path(__file__).resolve().parents[2]
DATA = Path(__file__).parent / "data"
FACTS = {
    "python": "3.11.9",
    "torch": "2.5.1+cu124",
    "cuda": "12.4",
    "gpu_name": "NVIDIA L4",
    "gpu_memory": 23_580_639_232,
}


def pyproject(folder: Path, **llm: object) -> None:
    rows = "".join(f"{key} = {json.dumps(value)}\n" for key, value in llm.items())
    (folder / "pyproject.toml").write_text(f"[tool.oom-lsp]\n\n[tool.oom-lsp.llm]\n{rows}")


@pytest.fixture
def project(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake: FakeModelServer, user_config: UserConfigWriter
) -> Path:
    """A project whose user enabled AI fixes in their own config file."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OOM_TEST_KEY", "secret-test-key")
    user_config(
        llm={"enabled": True, "base-url": fake.base_url, "model": "test-model", "api-key-env": "OOM_TEST_KEY"}
    )
    pyproject(tmp_path)
    (tmp_path / "train.py").write_text(TRAIN)
    # A stand-in for the user's interpreter: answers the environment probe without importing torch.
    python = tmp_path / "fake-python"
    python.write_text(f"#!/bin/sh\necho 'OOM_LSP_FACTS {json.dumps(FACTS)}'\n")
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    return tmp_path


def run(*argv: str) -> int:
    return cli.main(list(argv))


def test_prompt_prints_the_sections_and_sends_nothing(
    project: Path, fake: FakeModelServer, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("prompt", "train.py", "--python", "./fake-python") == 0
    out, err = capsys.readouterr()
    assert out.startswith("## Context\n- File: `train.py`, line 15 (function `train`)\n")
    assert (
        "- Framework: PyTorch 2.5.1+cu124, CUDA 12.4; Python 3.11.9\n- GPU: NVIDIA L4, 21.96 GiB (from the interpreter)"
        in out
    )
    assert "## Error" not in out and "## Profiling" not in out
    # The first finding shown gives the line: the loss kept with its graph (the float32
    # loop's OOM201, sized by nothing, is shown in strict mode only).
    assert "Start from the finding OOM301" in out
    assert "tokens (characters / 4); nothing was sent" in err and fake.requests == []


def test_prompt_with_log_and_profile(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shutil.copy(ROOT / "fixtures" / "cnn_cifar_risky.py", project / "cnn_cifar_risky.py")
    code = run(
        "prompt",
        "cnn_cifar_risky.py",
        "--error",
        str(DATA / "cnn_oom.log"),
        "--profile",
        str(DATA / "cnn_report.json"),
        "--python",
        "./fake-python",
        "--system",
    )
    out, _ = capsys.readouterr()
    assert code == 0
    assert out.startswith("<!-- system message -->\nYou are a PyTorch GPU-memory expert.")
    assert [line for line in out.splitlines() if line.startswith("## ") and "<" not in line][-7:] == [
        "## Context",
        "## Error",
        "## Profiling",
        "## Diagnosis",
        "## Solutions",
        "## Validation",
        "## Documentation",
    ]
    assert "line 102 (module-level code)" in out


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--error", "train.py"], "no out-of-memory error found"),
        (["--profile", "train.py"], "not JSON"),
        (["--line", "99"], "line 99 is outside train.py"),
    ],
)
def test_prompt_input_errors(
    project: Path, capsys: pytest.CaptureFixture[str], arguments: list[str], message: str
) -> None:
    assert run("prompt", "train.py", "--python", "./fake-python", *arguments) == 2
    assert message in capsys.readouterr().err


def test_fix_dry_run_prints_the_diff_and_changes_nothing(
    project: Path, fake: FakeModelServer, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.script({"content": GOOD_ANSWER})
    assert (
        run("fix", "--ai", "train.py", "--line", str(TARGET_LINE), "--dry-run", "--python", "./fake-python")
        == 0
    )
    out, err = capsys.readouterr()
    assert "-        total_loss += loss\n+" + FIXED_LINE in out
    assert (
        "1. Loss accumulated with its graph (high)" in out and "--dry-run: train.py was not changed." in out
    )
    assert "asking test-model at 127.0.0.1:" in err
    assert (project / "train.py").read_text() == TRAIN and not (project / "OOM_FIXES.md").exists()
    assert fake.requests[0]["headers"]["authorization"] == "Bearer secret-test-key"


def test_fix_applies_and_logs(
    project: Path, fake: FakeModelServer, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.script({"content": GOOD_ANSWER})
    assert run("fix", "--ai", "train.py", "--line", "15", "--python", "./fake-python") == 0
    out, _ = capsys.readouterr()
    assert (project / "train.py").read_text() == TRAIN.replace("        total_loss += loss\n", FIXED_LINE)
    assert "Applied to train.py; logged in" in out
    log = (project / "OOM_FIXES.md").read_text()
    assert log.startswith(fixlog.HEADER)
    assert " · OOM301 loss-accumulated-with-graph · `train.py`" in log
    assert "Accumulate the training loss with .item() so each step's graph is freed" in log
    assert "+" + FIXED_LINE in log and "## Diagnosis" in log  # the diff and the answer
    assert "- Peak before / after: not measured yet" in log
    assert "secret-test-key" not in log


@pytest.mark.parametrize(
    ("turns", "code", "message"),
    [
        (
            [NO_MATCH_ANSWER, NO_MATCH_ANSWER],
            1,
            "No edit: could not apply the proposed change: the SEARCH text",
        ),
        ([AMBIGUOUS_ANSWER, AMBIGUOUS_ANSWER], 1, "matches 2 places"),
        ([BROKEN_ANSWER, BROKEN_ANSWER], 1, "does not parse"),
        ([GARBAGE, GARBAGE], 2, "could not be read, twice"),
    ],
)
def test_bad_answers_never_change_the_file(
    project: Path,
    fake: FakeModelServer,
    capsys: pytest.CaptureFixture[str],
    turns: list[str],
    code: int,
    message: str,
) -> None:
    fake.script(*({"content": turn} for turn in turns))
    assert run("fix", "--ai", "train.py", "--python", "./fake-python") == code
    out, err = capsys.readouterr()
    assert message in out + err
    assert (project / "train.py").read_text() == TRAIN and not (project / "OOM_FIXES.md").exists()


def test_server_failure_never_changes_the_file(
    project: Path, fake: FakeModelServer, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.script(*[{"status": 500, "error": "overloaded", "headers": {"retry-after-ms": "5"}}] * 3)
    assert run("fix", "--ai", "train.py", "--python", "./fake-python") == 2
    assert "failed (HTTP 500" in capsys.readouterr().err
    assert (project / "train.py").read_text() == TRAIN


def test_fix_disabled_says_how_to_enable(
    project: Path, fake: FakeModelServer, capsys: pytest.CaptureFixture[str], user_config: UserConfigWriter
) -> None:
    user_config(llm={"base-url": fake.base_url, "model": "test-model"})
    assert run("fix", "--ai", "train.py") == 2
    err = capsys.readouterr().err
    assert "AI fixes are disabled, and nothing was sent" in err and "enabled = true" in err
    assert "oom-lsp/config.toml" in err
    assert fake.requests == []


def test_a_project_may_switch_ai_fixes_off(
    project: Path, fake: FakeModelServer, capsys: pytest.CaptureFixture[str]
) -> None:
    pyproject(project, enabled=False)
    assert run("fix", "--ai", "train.py") == 2
    assert "AI fixes are disabled, and nothing was sent" in capsys.readouterr().err
    assert fake.requests == []


def test_fix_without_key_names_the_variable(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], user_config: UserConfigWriter
) -> None:
    user_config(
        llm={"enabled": True, "base-url": "https://llm.example.com/v1", "model": "m", "api-key-env": "MY_LLM_KEY"}
    )
    monkeypatch.delenv("MY_LLM_KEY", raising=False)
    assert run("fix", "--ai", "train.py") == 2
    assert "no API key: set the environment variable MY_LLM_KEY" in capsys.readouterr().err


def _hostile(project: Path, base_url: str, **more: object) -> None:
    """What a cloned repository can ship: its own pyproject.toml naming a server and,
    as the key, another secret of the environment."""
    pyproject(project, enabled=True, **{"base-url": base_url, "model": "m", "api-key-env": "AWS_SECRET_ACCESS_KEY"}, **more)


def test_a_project_cannot_choose_the_server_or_the_key(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], user_config: UserConfigWriter
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value")
    with FakeModelServer() as attacker:
        user_config()  # the user enabled nothing
        _hostile(project, attacker.base_url)
        assert run("fix", "--ai", "train.py", "--python", "./fake-python") == 2
        err = capsys.readouterr().err
        assert attacker.requests == []
    assert "AI fixes are disabled, and nothing was sent" in err
    assert "sets enabled, base-url, api-key-env, which a project cannot decide for you" in err
    assert f'trusted-projects = ["{project}"]' in err


def test_with_ai_enabled_by_the_user_a_project_still_cannot_redirect_it(
    project: Path, fake: FakeModelServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret-value")
    fake.script({"content": GOOD_ANSWER})
    with FakeModelServer() as attacker:
        _hostile(project, attacker.base_url)
        assert run("fix", "--ai", "train.py", "--line", "15", "--dry-run", "--python", "./fake-python") == 0
        assert attacker.requests == []
    err = capsys.readouterr().err
    assert "ignoring part of the project's settings" in err
    (sent,) = fake.requests
    assert sent["headers"]["authorization"] == "Bearer secret-test-key"  # the user's key, to the user's server
    assert "aws-secret-value" not in json.dumps(sent)


def test_a_trusted_project_may_set_everything(
    project: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], user_config: UserConfigWriter
) -> None:
    monkeypatch.setenv("PROJECT_LLM_KEY", "project-key")
    with FakeModelServer() as own:
        own.script({"content": GOOD_ANSWER})
        user_config(trusted=[project])
        pyproject(project, enabled=True, **{"base-url": own.base_url, "model": "m", "api-key-env": "PROJECT_LLM_KEY"})
        assert run("fix", "--ai", "train.py", "--line", "15", "--dry-run", "--python", "./fake-python") == 0
        assert own.requests[0]["headers"]["authorization"] == "Bearer project-key"
    assert "ignoring" not in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fix_log", "message"),
    [
        ("train.py", "must be a Markdown file"),
        ("../outside.md", "is outside the project"),
        ("~/.bashrc", "must be a Markdown file"),
        ("/tmp/oom-lsp-elsewhere.md", "is outside the project"),
        ("README.md", "exists and is not an oom-lsp fix log"),
    ],
)
def test_the_fix_log_stays_a_log_inside_the_project(
    project: Path, fake: FakeModelServer, capsys: pytest.CaptureFixture[str], fix_log: str, message: str
) -> None:
    (project / "README.md").write_text("# Demo\n")
    pyproject(project, **{"fix-log": fix_log})
    fake.script({"content": GOOD_ANSWER})
    assert run("fix", "--ai", "train.py", "--line", "15", "--python", "./fake-python") == 2
    assert message in capsys.readouterr().err
    assert fake.requests == []  # refused before anything was sent
    assert (project / "train.py").read_text() == TRAIN
    assert (project / "README.md").read_text() == "# Demo\n"
    assert not (project.parent / "outside.md").exists()


def test_the_fix_log_is_capped_and_its_diff_redacted(
    project: Path, fake: FakeModelServer, capsys: pytest.CaptureFixture[str]
) -> None:
    source = TRAIN.replace("        total_loss += loss\n", '        total_loss += loss  # token="hunter2-very-secret"\n')
    (project / "train.py").write_text(source)
    answer = GOOD_ANSWER.replace("        total_loss += loss\n=", '        total_loss += loss  # token="__REDACTED_1__"\n=')
    answer = "Let me think. " * 5_000 + "\n" + answer  # prose before the first heading is accepted
    fake.script({"content": answer})
    assert run("fix", "--ai", "train.py", "--line", "15", "--python", "./fake-python") == 0, capsys.readouterr()
    log = (project / "OOM_FIXES.md").read_text()
    assert "hunter2-very-secret" not in log and "-        total_loss += loss  # token=\"__REDACTED_" in log
    assert "more characters not logged" in log and len(log) < 3 * fixlog.MAX_SECTION_CHARS


def test_fix_needs_ai(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("fix", "train.py") == 2
    assert "`fix` needs --ai" in capsys.readouterr().err


def test_fix_log_setting(project: Path, fake: FakeModelServer) -> None:
    pyproject(project, **{"fix-log": "docs/memory-fixes.md"})
    fake.script({"content": GOOD_ANSWER})
    assert run("fix", "--ai", "train.py", "--python", "./fake-python") == 0
    assert "OOM301 loss-accumulated-with-graph" in (project / "docs" / "memory-fixes.md").read_text()


def _reports(project: Path, after_peak: int) -> tuple[Path, Path]:
    from tests.llm.data.make_reports import cnn_report

    before = cnn_report()
    after = cnn_report()
    after.status, after.oom, after.peak_allocated = "completed", None, after_peak
    before.write(project / "before.json")
    after.write(project / "after.json")
    return project / "before.json", project / "after.json"


def test_validate_compares_and_records_in_the_fix_log(
    project: Path, fake: FakeModelServer, capsys: pytest.CaptureFixture[str]
) -> None:
    fake.script({"content": GOOD_ANSWER})
    assert run("fix", "--ai", "train.py", "--python", "./fake-python") == 0
    before, after = _reports(project, 3 * 2**30)
    capsys.readouterr()
    assert run("validate", "train.py", "--before", str(before), "--after", str(after)) == 0
    out = capsys.readouterr().out
    assert "peak before: 7.02 GiB (profile, " in out and "peak after:  3.00 GiB (profile, " in out
    assert "change:      -4.02 GiB (-57.3%) (measured by profile)" in out
    assert "recorded in" in out
    log = (project / "OOM_FIXES.md").read_text()
    assert "- Peak before / after: 7.02 GiB → 3.00 GiB, -4.02 GiB (-57.3%) (measured by profile)" in log


def test_validate_reports_a_peak_that_grew(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, after = _reports(project, 8 * 2**30)
    assert run("validate", "train.py", "--before", str(before), "--after", str(after), "--no-log") == 1
    assert "+1002.00 MiB" in capsys.readouterr().out


def test_validate_refuses_mixed_kinds(project: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before, _ = _reports(project, 1)
    assert (
        run("validate", "train.py", "--before", str(before), "--after", str(DATA / "gpt_estimate.json")) == 2
    )
    assert "compare like with like" in capsys.readouterr().err


def test_validate_reruns_the_estimate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    script = tmp_path / "mlp.py"
    shutil.copy(ROOT / "fixtures" / "estimate" / "mlp.py", script)
    before = {
        "script": str(script),
        "device": "cpu",
        "peak_bytes": 10**9,
        "method": "fake-tensor trace",
        "gpu": None,
    }
    (tmp_path / "before.json").write_text(json.dumps(before))
    assert run("validate", "mlp.py", "--before", "before.json", "--timeout", "240") == 0
    out = capsys.readouterr().out
    assert "peak before: 953.67 MiB (estimate, before.json)" in out
    assert "peak after:  " in out and "(estimate, a new estimate)" in out and "change:      -" in out


def test_validate_reads_reports_written_by_the_profiler(project: Path) -> None:
    before, _ = _reports(project, 1)
    assert read_report(before).peak_allocated == 7_190 * 2**20


def test_prompt_uses_the_last_profile_of_the_script(
    project: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.llm.data.make_reports import cnn_report

    report = cnn_report()
    report.script = str(project / "train.py")
    report.write(project / ".oom_lsp" / "profile" / "report.json")
    assert run("prompt", "train.py", "--python", "./fake-python") == 0
    out, err = capsys.readouterr()
    assert "## Profiling\nMeasured by `oom-lsp profile`" in out
    assert "using the last profile of train.py: .oom_lsp/profile/report.json" in err
    report.script = str(project / "other.py")  # another script's profile is not used
    report.write(project / ".oom_lsp" / "profile" / "report.json")
    assert run("prompt", "train.py", "--python", "./fake-python") == 0
    assert "## Profiling" not in capsys.readouterr().out


def test_fix_an_oom_error_from_a_log(
    project: Path, fake: FakeModelServer, capsys: pytest.CaptureFixture[str]
) -> None:
    original = (ROOT / "fixtures" / "cnn_cifar_risky.py").read_text()
    (project / "cnn_cifar_risky.py").write_text(original)
    answer = GOOD_ANSWER.replace(
        "        optimizer.zero_grad()\n        total_loss += loss\n=======\n        optimizer.zero_grad()\n",
        "        optimizer.step()\n\n        total_loss += loss\n=======\n        optimizer.step()\n\n",
    )
    fake.script({"content": answer})
    code = run(
        "fix", "--ai", "cnn_cifar_risky.py", "--error", str(DATA / "cnn_oom.log"), "--python", "./fake-python"
    )
    out, err = capsys.readouterr()
    assert code == 0, out + err
    assert "about CUDA out of memory (cnn_cifar_risky.py, line 102)" in err
    fixed = (project / "cnn_cifar_risky.py").read_text()
    assert fixed == original.replace("        total_loss += loss\n", FIXED_LINE, 1)
    assert " · CUDA out of memory · `cnn_cifar_risky.py`" in (project / "OOM_FIXES.md").read_text()
    sent = fake.requests[0]["body"]["messages"][1]["content"]
    assert "## Error" in sent and "OutOfMemoryError" in sent


@pytest.mark.parametrize(
    ("encode", "name"),
    [
        (lambda text: text.replace("\n", "\r\n").encode(), "CRLF line endings"),
        (lambda text: b"\xef\xbb\xbf" + text.encode(), "a UTF-8 BOM"),
        (lambda text: ("# -*- coding: latin-1 -*-\n# caf\xe9\n" + text).encode("latin-1"), "a latin-1 cookie"),
    ],
)
def test_fix_keeps_the_file_as_it_was_written(
    project: Path, fake: FakeModelServer, capsys: pytest.CaptureFixture[str], encode: Any, name: str
) -> None:
    (project / "train.py").write_bytes(encode(TRAIN))
    fake.script({"content": GOOD_ANSWER})
    assert run("fix", "--ai", "train.py", "--line", "17" if "cookie" in name else "15", "--python", "./fake-python") == 0, (
        capsys.readouterr()
    )
    assert (project / "train.py").read_bytes() == encode(TRAIN.replace("        total_loss += loss\n", FIXED_LINE))
