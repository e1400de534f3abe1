"""Editor settings (namespace `oomLsp`) and the lint settings of each file.

Editor settings arrive as `initializationOptions` (either `{"settings": {...}}`
or the flat `oomLsp` object), as the answer to `workspace/configuration`
(section `oomLsp`) and with `workspace/didChangeConfiguration` (`{"oomLsp":
{...}}`, or nothing when the client expects the server to ask again).

The lint keys are those of `[tool.oom-lsp]` in camelCase (`select`,
`extendSelect`, `ignore`, `severity`, `maxBatchSize`, ...). They are the
defaults under a project's `pyproject.toml`: the project's configuration wins
for everything it sets, so the editor and CI agree. `llm` is the user's own
(oom_lsp.llm.settings layers it with the project's table, which may not set
where code and keys go). `logLevel`, `logFile` and `debounceMs` belong to the
server only; `gpu`, `interpreter` and `profile` to the server commands
(`EditorSettings.commands`).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oom_lsp.analysis import LintSettings, default_settings
from oom_lsp.config import ConfigError, ConfigResolver, ProjectConfig, parse_config_table, validate_llm_table
from oom_lsp.notebooks import is_notebook_path

logger = logging.getLogger(__name__)

SECTION = "oomLsp"
# Read by the configuration code when it looks for a project's settings.
CONFIG_FILE_NAMES = ("pyproject.toml", "oom-lsp.toml", ".oom-lsp.toml")
DEFAULT_DEBOUNCE_MS = 75
_LOG_LEVELS = {
    "error": logging.ERROR,
    "warning": logging.WARNING,
    "info": logging.INFO,
    "debug": logging.DEBUG,
}
# `workspaceTrusted`: false from an editor whose user has not trusted the workspace (VS Code's
# restricted mode): the lenses and commands that run its code are then not offered.
_SERVER_KEYS = ("logLevel", "logFile", "debounceMs", "llm", "workspaceTrusted")
# Read by the server commands (docs/server-commands.md), not by the analysis.
COMMAND_KEYS = ("gpu", "interpreter", "profile", "worldSize")


@dataclass(frozen=True)
class EditorSettings:
    lint: dict[str, Any] = field(default_factory=dict)  # camelCase [tool.oom-lsp] keys
    log_level: int = logging.INFO
    log_file: str | None = None
    debounce_seconds: float = DEFAULT_DEBOUNCE_MS / 1000
    commands: dict[str, Any] = field(default_factory=dict)  # COMMAND_KEYS, as sent
    llm: dict[str, Any] = field(default_factory=dict)  # `oomLsp.llm`, type-checked, kebab-case keys
    problems: tuple[str, ...] = ()  # settings ignored, for the user
    # The editor's word on the workspace: False in VS Code's restricted mode. Clients that have
    # no such notion (Neovim, Helix) send nothing: the user who opened the files decides.
    workspace_trusted: bool = True


def unwrap(payload: Any) -> dict[str, Any] | None:
    """The `oomLsp` object inside what a client sent, or None when it sent
    none (`null`, or a didChangeConfiguration without settings)."""
    if not isinstance(payload, Mapping):
        return None
    if isinstance(payload.get(SECTION), Mapping):
        return dict(payload[SECTION])
    if isinstance(payload.get("settings"), Mapping):
        inner = payload["settings"]
        return dict(inner[SECTION]) if isinstance(inner.get(SECTION), Mapping) else dict(inner)
    return dict(payload)


def parse_editor_settings(raw: Mapping[str, Any]) -> EditorSettings:
    """Typed editor settings; a bad server-only value is logged and replaced
    by its default (the lint keys are checked by the configuration code)."""
    lint = {key: value for key, value in raw.items() if key not in _SERVER_KEYS and key not in COMMAND_KEYS}
    level_name = raw.get("logLevel", "info")
    log_level = _LOG_LEVELS.get(str(level_name).lower()) if level_name is not None else logging.INFO
    if log_level is None:
        logger.warning("oomLsp.logLevel %r is not one of %s; using info", level_name, ", ".join(_LOG_LEVELS))
        log_level = logging.INFO
    log_file = raw.get("logFile")
    if log_file is not None and not isinstance(log_file, str):
        logger.warning("oomLsp.logFile must be a path, got %r; not logging to a file", log_file)
        log_file = None
    debounce = raw.get("debounceMs", DEFAULT_DEBOUNCE_MS)
    if isinstance(debounce, bool) or not isinstance(debounce, (int, float)) or debounce < 0:
        logger.warning(
            "oomLsp.debounceMs must be a number >= 0, got %r; using %d", debounce, DEFAULT_DEBOUNCE_MS
        )
        debounce = DEFAULT_DEBOUNCE_MS
    llm: dict[str, Any] = {}
    problems: list[str] = []
    trusted = raw.get("workspaceTrusted", True)
    if not isinstance(trusted, bool):
        problems.append(f"Ignoring oomLsp.workspaceTrusted: expected true or false, got {trusted!r}; not trusted")
        trusted = False
    if raw.get("llm") is not None:
        try:
            llm = validate_llm_table(raw["llm"], "editor settings")
        except ConfigError as error:
            problems.append(f"Ignoring oomLsp.llm: {error}")
    return EditorSettings(
        llm=llm,
        problems=tuple(problems),
        lint=lint,
        log_level=log_level,
        log_file=os.path.expanduser(log_file) if log_file else None,
        debounce_seconds=debounce / 1000,
        commands={key: raw[key] for key in COMMAND_KEYS if key in raw},
        workspace_trusted=trusted,
    )


def _kebab(key: str) -> str:
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"-\1", key).lower()


def _top_level_key(lint: dict[str, Any], error_key: str | None) -> str | None:
    """The editor key a ConfigError is about (`maxBatchSize` for
    `max-batch-size`, `severity` for `severity.OOM1`)."""
    if error_key is None:
        return None
    top = error_key.split(".", 1)[0]
    return next((key for key in lint if key == top or _kebab(key) == _kebab(top)), None)


class ConfigFilesWatch:
    """Notices a changed, created or deleted config file next to (or above) a
    file before it is analysed: the reload path for clients that cannot
    watch files for the server."""

    def __init__(self) -> None:
        self._seen: dict[Path, int | None] = {}

    def _candidates(self, path: Path) -> list[Path]:
        return [directory / name for directory in path.parents for name in CONFIG_FILE_NAMES]

    def changed(self, path: Path) -> bool:
        changed = False
        for candidate in self._candidates(path):
            try:
                stamp: int | None = candidate.stat().st_mtime_ns
            except OSError:
                stamp = None
            if candidate in self._seen and self._seen[candidate] != stamp:
                changed = True
            self._seen[candidate] = stamp
        return changed


class LintSettingsSource:
    """The lint settings of each file: the project's configuration over the
    editor's settings (`oom_lsp.config.ConfigResolver`), reloaded when a
    config file changes."""

    def __init__(self, root: Path | None = None, report_error: Callable[[str], None] = logger.error) -> None:
        self._root = root
        self._report_error = report_error
        self._watch = ConfigFilesWatch()
        self._reported: set[str] = set()
        self._editor_lint: dict[str, Any] = {}
        self._excluded_folders: dict[Path, bool] = {}
        self._resolver = self._make_resolver({})

    def _make_resolver(self, lint: dict[str, Any]) -> ConfigResolver:
        """A resolver over the editor settings, without the ones it rejects
        (each reported): one bad or unknown key, say from a newer editor
        extension, must not throw away the rest."""
        while True:
            try:
                resolver = ConfigResolver(defaults=lint, fallback_root=self._root)
            except ConfigError as error:
                culprit = _top_level_key(lint, error.key)
                if culprit is None:
                    self._report(f"Ignoring the editor settings: {error}")
                    lint = {}
                    continue
                self._report(f"Ignoring oomLsp.{culprit}: {error}")
                lint = {key: value for key, value in lint.items() if key != culprit}
                continue
            self._editor_lint = lint
            return resolver

    def _report(self, message: str) -> None:
        # A broken file is reported once, not on every keystroke.
        if message not in self._reported:
            self._reported.add(message)
            self._report_error(message)

    def update_editor_settings(self, editor: EditorSettings) -> None:
        self._reported.clear()
        self._excluded_folders.clear()
        self._resolver = self._make_resolver(editor.lint)

    def invalidate(self) -> None:
        """Forget every configuration read so far (a config file changed)."""
        self._reported.clear()
        self._excluded_folders.clear()
        self._resolver.invalidate()

    def for_path(self, path: Path | None) -> LintSettings | None:
        """Settings for a file on disk, or for a buffer with no path (an
        `untitled:` document: the editor settings alone); None for a file the
        configuration excludes (`exclude`, `extend-exclude`: a virtualenv's
        torch sources opened by go-to-definition get no diagnostics)."""
        if path is None:
            return self._editor_only(Path("untitled.py"))
        if self._watch.changed(path):
            logger.info("A configuration file above %s changed; reloading the configuration", path)
            self.invalidate()
        try:
            config = self._resolver.resolve(path)
        except ConfigError as error:
            self._report(f"{error}; using the editor settings for {path.name}")
            return self._editor_only(path)
        if self._excluded(config, path) or (is_notebook_path(str(path)) and not config.is_included(path)):
            # A notebook is checked when `include` takes it, as in a folder's walk; a Python
            # buffer always is (Ruff's server decides the same by the language).
            return None
        return config.settings_for(path)

    def project_config(self, path: Path | None) -> ProjectConfig:
        """The whole configuration of a file (root, `gpu-memory`, the `llm`
        table), for the features beyond linting; the editor settings alone
        for a buffer without a path or under a broken configuration file."""
        if path is not None:
            if self._watch.changed(path):
                self.invalidate()
            try:
                return self._resolver.resolve(path)
            except ConfigError as error:
                self._report(f"{error}; using the editor settings for {path.name}")
        try:
            return parse_config_table(self._editor_lint, "editor settings", self._root or Path.cwd())
        except ConfigError:
            return parse_config_table({}, "defaults", self._root or Path.cwd())

    def _excluded(self, config: ProjectConfig, path: Path) -> bool:
        """Whether the file or a folder between it and the project root
        matches `exclude`, as the CLI's discovery would have skipped it. Above
        a file outside the root nothing is checked: the folder names of an
        unrelated path (a `build/` in the home folder) say nothing."""
        folder = path.parent
        if folder not in self._excluded_folders:
            chain = [folder, *folder.parents]
            inside = chain[: chain.index(config.root)] if config.root in chain else []
            self._excluded_folders[folder] = any(config.is_excluded(parent) for parent in inside)
        return self._excluded_folders[folder] or config.is_excluded(path)

    def _editor_only(self, path: Path) -> LintSettings:
        root = self._root or Path.cwd()
        try:
            return parse_config_table(self._editor_lint, "editor settings", root).settings_for(
                root / path.name
            )
        except ConfigError:
            return default_settings()
