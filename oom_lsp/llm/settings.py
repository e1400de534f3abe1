"""The `[tool.oom-lsp.llm]` table (and the editor's `oomLsp.llm.*`) as one typed object.

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

    @classmethod
    def from_table(cls, table: Mapping[str, Any]) -> LlmSettings:
        """From the (type-checked) `llm` table of ProjectConfig; camelCase keys are accepted too."""
        values = {_CAMEL_TO_KEBAB.get(key, key): value for key, value in table.items()}
        return cls(
            enabled=bool(values.get("enabled", False)),
            base_url=values.get("base-url") or None,
            model=values.get("model") or None,
            api_key_env=values.get("api-key-env") or DEFAULT_API_KEY_ENV,
            timeout=float(values.get("timeout", DEFAULT_TIMEOUT)),
            response_format=values.get("response-format", "text"),
            fix_log=values.get("fix-log") or DEFAULT_FIX_LOG,
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

    def check_ready(self) -> None:
        """Raise NotReady with what to set, before anything is built or sent."""
        if not self.enabled:
            raise NotReady(
                "disabled",
                "AI fixes are disabled, and nothing was sent. To enable them, add to pyproject.toml:\n"
                "    [tool.oom-lsp.llm]\n"
                "    enabled = true\n"
                '    base-url = "http://localhost:11434/v1"   # any OpenAI-compatible server\n'
                '    model = "qwen2.5-coder:14b"\n'
                "(docs/ai-fixes.md lists examples for OpenAI, Azure, Ollama, vLLM, llama.cpp and LM Studio)",
            )
        missing = [key for key, value in (("base-url", self.base_url), ("model", self.model)) if not value]
        if missing:
            raise NotReady(
                "not-configured",
                f"AI fixes are enabled but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} "
                "not set in [tool.oom-lsp.llm]; nothing was sent",
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
            f"(api-key-env in [tool.oom-lsp.llm]) for {self.host}; nothing was sent",
        )

    def fix_log_path(self, root: Path) -> Path:
        path = Path(self.fix_log).expanduser()
        return path if path.is_absolute() else root / path
