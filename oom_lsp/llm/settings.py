"""The LLM settings as one typed object, and who may set what (docs/ai-fixes.md#security).

Sources, lowest first: the user's own `~/.config/oom-lsp/config.toml` (`[llm]`), the
editor's `oomLsp.llm.*`, the project's `[tool.oom-lsp.llm]`, the command line. A
project is code someone else may have written: its table may choose the model, the
timeout, the answer format and the fix log (inside the project), and may switch AI
fixes off, but whether anything is sent, to which server and with which environment
variable as the bearer token (`USER_KEYS`) come from the user, unless the user listed
the project in `trusted-projects`. An untrusted project's values for those keys are
ignored and named in `ignored`, so the messages can say why.

oom_lsp.config checks the types; this module gives the keys their meaning and defaults.
The API key itself never appears here: only the name of the environment variable that
holds it, read at the moment of the request.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from oom_lsp.config import ProjectConfig, UserConfig, load_user_config, user_config_path

DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
DEFAULT_TIMEOUT = 90.0
DEFAULT_FIX_LOG = "OOM_FIXES.md"
# Local servers ignore the key, but the openai SDK refuses to run without one.
LOCAL_PLACEHOLDER_KEY = "not-needed"
_CAMEL_TO_KEBAB = {
    "baseUrl": "base-url",
    "apiKeyEnv": "api-key-env",
    "responseFormat": "response-format",
    "fixLog": "fix-log",
}
# Where the code goes and which secret goes with it: the user's decision alone.
USER_KEYS = ("enabled", "base-url", "api-key-env")


class NotReady(Exception):
    """LLM fixes cannot run with these settings; the message tells the user what to set.
    `kind`: "disabled", "not-configured" or "no-key"."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class LlmSettings:
    enabled: bool = False
    base_url: str | None = None
    model: str | None = None
    api_key_env: str = DEFAULT_API_KEY_ENV
    timeout: float = DEFAULT_TIMEOUT
    response_format: str = "text"  # "text" or "json_schema"
    fix_log: str = DEFAULT_FIX_LOG  # relative to the project root
    # Not configurable from pyproject: an editor wants one quick retry, not the SDK's long defaults.
    max_retries: int = 2
    max_output_tokens: int = 1500
    # USER_KEYS an untrusted project set, ignored; and the file that set them.
    ignored: tuple[str, ...] = ()
    project_file: str | None = None
    project_root: str | None = None

    @classmethod
    def from_table(cls, table: Mapping[str, Any], **extra: Any) -> LlmSettings:
        """From one type-checked `llm` table; camelCase keys are accepted too."""
        values = {_CAMEL_TO_KEBAB.get(key, key): value for key, value in table.items()}
        return cls(
            enabled=bool(values.get("enabled", False)),
            base_url=values.get("base-url") or None,
            model=values.get("model") or None,
            api_key_env=values.get("api-key-env") or DEFAULT_API_KEY_ENV,
            timeout=float(values.get("timeout", DEFAULT_TIMEOUT)),
            response_format=values.get("response-format", "text"),
            fix_log=values.get("fix-log") or DEFAULT_FIX_LOG,
            **extra,
        )

    @property
    def host(self) -> str:
        """Where the code goes, for messages and action titles: "localhost:11434"."""
        return urlparse(self.base_url or "").netloc or (self.base_url or "?")

    @property
    def is_local(self) -> bool:
        hostname = urlparse(self.base_url or "").hostname or ""
        if hostname == "localhost":
            return True
        try:
            return ipaddress.ip_address(hostname).is_loopback
        except ValueError:
            return False

    def _ignored_note(self) -> str:
        keys = ", ".join(self.ignored)
        return (
            f"{self.project_file} sets {keys}, which a project cannot decide for you (it is not a "
            f"trusted project). Set them under [llm] in {user_config_path()} or in the editor's "
            f'oomLsp.llm settings, or trust this project there: trusted-projects = ["{self.project_root}"]'
        )

    def notes(self) -> list[str]:
        """What to tell the user although the settings are usable: the project values ignored."""
        return [f"ignoring part of the project's settings: {self._ignored_note()}"] if self.ignored else []

    def check_ready(self) -> None:
        """Raise NotReady with what to set, before anything is built or sent."""
        if not self.enabled:
            if "enabled" in self.ignored:
                raise NotReady("disabled", f"AI fixes are disabled, and nothing was sent: {self._ignored_note()}")
            raise NotReady(
                "disabled",
                "AI fixes are disabled, and nothing was sent. To enable them, add to "
                f"{user_config_path()} (or set the editor's oomLsp.llm.* settings):\n"
                "    [llm]\n"
                "    enabled = true\n"
                '    base-url = "http://localhost:11434/v1"   # any OpenAI-compatible server\n'
                '    model = "qwen2.5-coder:14b"\n'
                "(docs/ai-fixes.md lists examples for OpenAI, Azure, Ollama, vLLM, llama.cpp and LM Studio)",
            )
        missing = [key for key, value in (("base-url", self.base_url), ("model", self.model)) if not value]
        if missing:
            where = f"; {self._ignored_note()}" if "base-url" in self.ignored else ""
            raise NotReady(
                "not-configured",
                f"AI fixes are enabled but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                f"not set; nothing was sent{where}",
            )

    def api_key(self, environ: Mapping[str, str] | None = None) -> str:
        """The key from the named environment variable; a placeholder for a loopback server."""
        environ = os.environ if environ is None else environ
        key = environ.get(self.api_key_env, "").strip()
        if key:
            return key
        if self.is_local:
            return LOCAL_PLACEHOLDER_KEY
        raise NotReady(
            "no-key",
            f"no API key: set the environment variable {self.api_key_env} "
            f"(api-key-env in your LLM settings) for {self.host}; nothing was sent",
        )

    def fix_log_path(self, root: Path) -> Path:
        """The fix log, checked: a Markdown file inside `root` (raises fixlog.FixLogError)."""
        from oom_lsp.llm.fixlog import checked_log_path

        path = Path(self.fix_log).expanduser()
        return checked_log_path(path if path.is_absolute() else root / path, root, self.fix_log)


def resolve_settings(
    project: ProjectConfig,
    *,
    editor: Mapping[str, Any] | None = None,
    command_line: Mapping[str, Any] | None = None,
    user: UserConfig | None = None,
) -> LlmSettings:
    """The LLM settings for a file of `project`: the layers of the module docstring.
    `editor` and `command_line` are type-checked `llm` tables (kebab-case); `user`
    defaults to the user's config file (which may raise ConfigError)."""
    user = load_user_config() if user is None else user
    trusted = project.path is not None and user.trusts(project.root)
    values: dict[str, Any] = {**user.llm, **(editor or {})}
    ignored = []
    for key, value in project.llm.items():
        if key in USER_KEYS and not trusted:
            if key == "enabled" and value is False:
                values[key] = False  # a project may always keep its own code from being sent
            else:
                ignored.append(key)
            continue
        values[key] = value
    values.update(command_line or {})
    return LlmSettings.from_table(
        values,
        ignored=tuple(ignored),
        project_file=_display(project.path) if ignored and project.path else None,
        project_root=str(project.root) if ignored else None,
    )


def _display(path: Path) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return str(path)
    return str(path) if relative.startswith("..") else relative
