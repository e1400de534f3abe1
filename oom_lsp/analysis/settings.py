"""The resolved settings one file is analysed with (pure data).

`oom_lsp.config` builds these from `[tool.oom-lsp]`, CLI flags or editor
settings; the analysis only ever sees this object.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from oom_lsp.analysis.findings import Severity


@dataclass(frozen=True)
class LintSettings:
    # Codes of the rules to run, already expanded from select/ignore/prefixes.
    enabled: frozenset[str]
    severity: dict[str, Severity] = field(default_factory=dict)
    max_batch_size: int = 32
    # Report also the findings whose memory at stake is not shown to matter
    # (`strict = true`, `--strict`); by default only those shown to matter.
    strict: bool = False

    def severity_of(self, code: str, default: Severity) -> Severity:
        return self.severity.get(code, default)

    def fingerprint(self) -> str:
        """A stable digest of everything that can change the findings."""
        payload = json.dumps(
            {
                "enabled": sorted(self.enabled),
                "severity": {code: sev.value for code, sev in sorted(self.severity.items())},
                "max_batch_size": self.max_batch_size,
                "strict": self.strict,
            },
            sort_keys=True,
        )
        return hashlib.sha256(payload.encode()).hexdigest()[:16]

    def __hash__(self) -> int:
        return hash(self.fingerprint())


def default_settings() -> LintSettings:
    from oom_lsp.analysis.registry import default_codes

    return LintSettings(enabled=frozenset(default_codes()))
