"""Every test runs without the developer's own `~/.config/oom-lsp/config.toml`: the LLM
settings (and trusted projects) of whoever runs the suite must not change its results,
nor send anything anywhere. Subprocesses (servers, CLI runs) inherit the variable."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

UserConfigWriter = Callable[..., Path]


@pytest.fixture(autouse=True, scope="session")
def _no_user_config(tmp_path_factory: pytest.TempPathFactory) -> None:
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("empty-config-home"))


def write_user_config(home: Path, *, llm: dict[str, Any] | None = None, trusted: list[Path] = ()) -> Path:
    """`<home>/oom-lsp/config.toml` with an `[llm]` table and `trusted-projects`."""
    path = home / "oom-lsp" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [f"trusted-projects = {json.dumps([str(folder) for folder in trusted])}", "", "[llm]"]
    rows += [f"{key} = {json.dumps(value)}" for key, value in (llm or {}).items()]
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.fixture
def user_config(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> UserConfigWriter:
    """A writer of the user's own config file, in a config home of this test alone."""
    home = tmp_path_factory.mktemp("config-home")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))

    def write(**values: Any) -> Path:
        return write_user_config(home, **values)

    return write
