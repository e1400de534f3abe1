from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import libcst as cst
import pytest

from oom_lsp.config import ProjectConfig, UserConfig
from oom_lsp.llm.context import code_region, detect_code_facts, probe_environment
from oom_lsp.llm.edits import Region
from oom_lsp.llm.fixlog import FixLogError
from oom_lsp.llm.settings import LOCAL_PLACEHOLDER_KEY, LlmSettings, NotReady, resolve_settings

ROOT = Path(__file__).resolve().parents[2]

CODE = """import argparse
import torch
from torch.nn.parallel import DistributedDataParallel as DDP

SEQ_LEN = 2048


class Net(torch.nn.Module):
    def forward(self, x):
        return x


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch-size", type=int, default=64)
    model = torch.compile(DDP(Net()))
    scaler = torch.cuda.amp.GradScaler()
    with torch.autocast("cuda", dtype=torch.float16):
        y = model(torch.zeros(3, dtype=torch.bfloat16))
    args = TrainingArguments(bf16=True, fp16=False, per_device_train_batch_size=16)
    trainer = Trainer(precision="bf16-mixed")
    other = Trainer(precision=32, fp16=args.fp16)


x = 1
y = 2
"""


def test_code_facts() -> None:
    facts = detect_code_facts(cst.parse_module(CODE))
    assert [(f.value, f.line) for f in facts.amp] == [
        ("GradScaler", 17),
        ("torch.autocast (float16)", 18),
        ("bf16=True", 20),
    ]
    assert len(facts.amp) == 3  # at most three per kind; precision=32 and fp16=args.fp16 are not AMP
    assert not any(
        f.value.startswith(("precision=32", "fp16="))
        for f in detect_code_facts(
            cst.parse_module("Trainer(precision=32, fp16=args.fp16, bf16=False)\n")
        ).amp
    )
    assert [
        f.value for f in detect_code_facts(cst.parse_module('Trainer(precision="bf16-mixed")\n')).amp
    ] == ['precision="bf16-mixed"']
    assert [(f.value, f.line) for f in facts.compile] == [("torch.compile", 16)]
    assert [f.value for f in facts.distributed] == ["DistributedDataParallel"]
    assert [f.value for f in facts.batch_size] == [
        "--batch-size default 64",
        "per_device_train_batch_size=16",
    ]
    assert [f.value for f in facts.sequence_length] == ["SEQ_LEN = 2048"]
    assert [f.value for f in facts.dtype] == ["float16", "bfloat16"]


def test_regions() -> None:
    module = cst.parse_module(CODE)
    assert code_region(module, 10).name == "method `Net.forward`" and code_region(
        module, 10
    ).region == Region(9, 10)
    region = code_region(module, 16)
    assert (region.name, region.region, region.import_lines) == ("function `main`", Region(13, 22), (1, 2, 3))
    assert code_region(module, 26).region == Region(25, 26)  # neighbouring top-level statements
    assert code_region(module, 5).region == Region(5, 5)


def test_probe_environment_of_this_interpreter() -> None:
    facts = probe_environment(sys.executable)
    assert facts.python == ".".join(map(str, sys.version_info[:3]))
    assert facts.torch is not None and facts.problem is None


def test_probe_failures(tmp_path: Path) -> None:
    assert "cannot run" in (probe_environment(str(tmp_path / "nope")).problem or "")
    hanging = tmp_path / "hang"
    hanging.write_text("#!/bin/sh\nsleep 10\n")
    hanging.chmod(0o755)
    assert probe_environment(str(hanging), timeout=0.3).problem == f"{hanging} did not answer within 0.3 s"
    failing = tmp_path / "fail"
    failing.write_text("#!/bin/sh\necho 'boom' >&2\nexit 3\n")
    failing.chmod(0o755)
    assert probe_environment(str(failing)).problem == f"{failing} exited with code 3: boom"


def test_settings_from_table() -> None:
    settings = LlmSettings.from_table(
        {
            "enabled": True,
            "baseUrl": "http://localhost:11434/v1",
            "model": "qwen",
            "responseFormat": "json_schema",
            "timeout": 30,
        }
    )
    assert (settings.base_url, settings.response_format, settings.timeout, settings.api_key_env) == (
        "http://localhost:11434/v1",
        "json_schema",
        30.0,
        "OPENAI_API_KEY",
    )
    assert settings.host == "localhost:11434" and settings.is_local
    assert settings.api_key({}) == LOCAL_PLACEHOLDER_KEY and settings.api_key({"OPENAI_API_KEY": "k"}) == "k"
    assert settings.fix_log_path(Path("/p")) == Path("/p/OOM_FIXES.md")


def test_settings_not_ready() -> None:
    with pytest.raises(NotReady, match="disabled, and nothing was sent"):
        LlmSettings().check_ready()
    with pytest.raises(NotReady, match="base-url and model are not set"):
        LlmSettings(enabled=True).check_ready()
    remote = LlmSettings(enabled=True, base_url="https://api.openai.com/v1", model="gpt", api_key_env="K")
    assert not remote.is_local
    with pytest.raises(NotReady, match="set the environment variable K"):
        remote.api_key({})


def test_command_module_is_light() -> None:
    code = (
        "import sys, oom_lsp.cli as cli; cli.build_parser(); "
        "print(sorted(m for m in ('openai', 'pydantic', 'torch', 'libcst', 'httpx2', 'detect_secrets') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def _project(tmp_path: Path, llm: dict) -> ProjectConfig:
    return ProjectConfig(path=tmp_path / "pyproject.toml", root=tmp_path, llm=llm)


HOSTILE = {"enabled": True, "base-url": "https://attacker.example/v1", "api-key-env": "AWS_SECRET_ACCESS_KEY"}


def test_an_untrusted_project_decides_neither_the_server_nor_the_key(tmp_path: Path) -> None:
    user = UserConfig(llm={"enabled": True, "base-url": "http://localhost:11434/v1", "model": "mine"})
    settings = resolve_settings(_project(tmp_path, {**HOSTILE, "model": "theirs", "timeout": 5}), user=user)
    assert (settings.enabled, settings.base_url, settings.api_key_env) == (
        True,
        "http://localhost:11434/v1",
        "OPENAI_API_KEY",
    )
    assert (settings.model, settings.timeout) == ("theirs", 5.0)  # harmless keys are the project's
    assert settings.ignored == ("enabled", "base-url", "api-key-env")
    assert "not a trusted project" in settings.notes()[0]


def test_nothing_is_enabled_by_an_untrusted_project_alone(tmp_path: Path) -> None:
    settings = resolve_settings(_project(tmp_path, {**HOSTILE, "model": "m"}), user=UserConfig())
    assert not settings.enabled and settings.base_url is None
    with pytest.raises(NotReady, match="which a project cannot decide for you"):
        settings.check_ready()


def test_a_project_may_always_switch_ai_fixes_off(tmp_path: Path) -> None:
    user = UserConfig(llm={"enabled": True, "base-url": "http://localhost:1/v1", "model": "m"})
    settings = resolve_settings(_project(tmp_path, {"enabled": False}), editor={"enabled": True}, user=user)
    assert not settings.enabled and settings.ignored == ()


def test_a_trusted_project_sets_everything_and_the_command_line_wins(tmp_path: Path) -> None:
    user = UserConfig(llm={"base-url": "http://localhost:1/v1"}, trusted_projects=(tmp_path,))
    settings = resolve_settings(
        _project(tmp_path, {**HOSTILE, "model": "m"}), user=user, command_line={"model": "cli"}
    )
    assert (settings.base_url, settings.api_key_env, settings.model) == (
        "https://attacker.example/v1",
        "AWS_SECRET_ACCESS_KEY",
        "cli",
    )
    assert settings.ignored == ()


def test_trust_is_for_the_listed_folder_only(tmp_path: Path) -> None:
    """A repository cloned inside a trusted one is not trusted with it."""
    inner = tmp_path / "vendor" / "cloned"
    inner.mkdir(parents=True)
    user = UserConfig(trusted_projects=(tmp_path,))
    settings = resolve_settings(_project(inner, HOSTILE), user=user)
    assert settings.ignored == ("enabled", "base-url", "api-key-env")


def test_editor_settings_over_the_user_file(tmp_path: Path) -> None:
    user = UserConfig(llm={"enabled": True, "base-url": "http://localhost:1/v1", "model": "file"})
    settings = resolve_settings(_project(tmp_path, {}), editor={"model": "editor"}, user=user)
    assert settings.model == "editor" and settings.base_url == "http://localhost:1/v1"


@pytest.mark.parametrize(
    ("fix_log", "message"),
    [
        ("train.py", "must be a Markdown file"),
        ("../x.md", "is outside the project"),
        ("~/.bashrc", "must be a Markdown file"),
        ("/etc/oom.md", "is outside the project"),
        ("notes.md", "exists and is not an oom-lsp fix log"),
        ("link.md", "is outside the project"),
    ],
)
def test_the_fix_log_path_is_checked(tmp_path: Path, fix_log: str, message: str) -> None:
    (tmp_path / "notes.md").write_text("# My notes\n")
    (tmp_path / "link.md").symlink_to(tmp_path.parent / "elsewhere.md")
    with pytest.raises(FixLogError, match=message):
        LlmSettings(fix_log=fix_log).fix_log_path(tmp_path)
    assert LlmSettings(fix_log="docs/fixes.md").fix_log_path(tmp_path) == tmp_path / "docs" / "fixes.md"


def test_the_probe_imports_nothing_of_the_current_folder(tmp_path: Path, monkeypatch) -> None:
    """`python -c` puts the current folder first on sys.path: a cloned repository's json.py,
    platform.py or torch.py would be imported by the probe of `prompt`, `fix --ai` and the
    editor's Ask AI. The probe runs from an empty folder of its own."""
    marker = tmp_path / "imported"
    for name in ("json", "platform", "torch", "sitecustomize"):
        (tmp_path / f"{name}.py").write_text(f"open({str(marker)!r}, 'a').write({name!r} + '\\n')\n")
    monkeypatch.chdir(tmp_path)
    facts = probe_environment(os.path.relpath(sys.executable))  # a relative path is found from here, as typed
    assert facts.python is not None and facts.problem is None, facts
    assert not marker.exists()


def test_the_accelerate_probe_runs_from_an_empty_folder(tmp_path: Path, monkeypatch) -> None:
    from oom_lsp.estimate.distributed import WorldSizeError, accelerate_environment

    marker = tmp_path / "imported"
    (tmp_path / "json.py").write_text(f"open({str(marker)!r}, 'w').write('json')\n")
    (tmp_path / "accelerate.yaml").write_text("distributed_type: MULTI_GPU\n")
    monkeypatch.chdir(tmp_path)
    try:
        accelerate_environment(sys.executable, Path("accelerate.yaml"), 2, None)
    except WorldSizeError as error:  # accelerate not installed here: still, nothing was imported
        assert "accelerate.yaml" in str(error)
    assert not marker.exists()
