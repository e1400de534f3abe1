"""Redact secrets before anything is sent, and put them back into the model's edits.

Each distinct secret becomes a numbered placeholder (`__REDACTED_1__`); the mapping
stays on this machine. The model quotes redacted lines in its SEARCH text, so the
placeholders are restored in SEARCH and REPLACE before matching: an edit that touches
such a line applies to the real text and keeps the real value.

What counts as a secret: known key formats anywhere (OpenAI `sk-`, Hugging Face `hf_`,
GitHub `ghp_`/`github_pat_`, AWS `AKIA`, Slack `xox?-`, PEM private keys), the password
of a `user:password@host` URL, and quoted values of 8 characters or more assigned to a
name containing key, token, secret or password (`api_key = "..."`, `login(key="...")`,
`{"hf_token": "..."}`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

PLACEHOLDER_RE = re.compile(r"__REDACTED_\d+__")
_KNOWN_FORMATS = (
    re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.DOTALL),
    re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}"),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
)
_URL_PASSWORD = re.compile(r"(?P<prefix>[a-z][a-z0-9+.-]*://[^\s:/@'\"]+:)(?P<secret>[^\s@/'\"]+)(?=@)", re.I)
_SENSITIVE_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "pwd"})
_NAME_SEGMENT = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_ASSIGNED_VALUE = re.compile(
    # name = "value", name: str = "value", name="value" (keyword), "name": "value" (dict)
    r"(?P<prefix>(?<![\w.])['\"]?(?P<name>[A-Za-z_][\w-]*)['\"]?\]?\s*(?::\s*[\w\[\]., ]+?\s*)?[:=]\s*"
    r"[rbuRBU]?(?P<quote>['\"]))(?P<secret>[^'\"\n]{8,})(?P=quote)",
    re.IGNORECASE,
)


@dataclass
class Redaction:
    text: str  # what may be sent
    secrets: dict[str, str] = field(default_factory=dict)  # placeholder -> original value

    def restore(self, text: str) -> str:
        return restore(text, self.secrets)


def redact(text: str, secrets: dict[str, str] | None = None) -> Redaction:
    """`text` with every secret replaced; `secrets` continues an earlier redaction's numbering."""
    mapping = dict(secrets or {})
    by_value = {value: placeholder for placeholder, value in mapping.items()}

    def placeholder_for(value: str) -> str:
        if value not in by_value:
            placeholder = f"__REDACTED_{len(mapping) + 1}__"
            mapping[placeholder] = value
            by_value[value] = placeholder
        return by_value[value]

    for pattern in _KNOWN_FORMATS:
        text = pattern.sub(lambda match: placeholder_for(match.group(0)), text)

    def replace_secret(match: re.Match[str]) -> str:
        secret = match.group("secret")
        if PLACEHOLDER_RE.fullmatch(secret) or (
            "name" in match.re.groupindex and not _is_sensitive(match["name"])
        ):
            return match.group(0)
        start, end = match.start("secret") - match.start(0), match.end("secret") - match.start(0)
        return match.group(0)[:start] + placeholder_for(secret) + match.group(0)[end:]

    for pattern in (_URL_PASSWORD, _ASSIGNED_VALUE):
        text = pattern.sub(replace_secret, text)
    return Redaction(text, mapping)


def _is_sensitive(name: str) -> bool:
    """`api_key`, `HF_TOKEN`, `apiKey`, `secret`, `db-password`: yes; `tokenizer`, `keys_seen`: no."""
    return any(segment.lower() in _SENSITIVE_WORDS for segment in _NAME_SEGMENT.findall(name))


def restore(text: str, secrets: dict[str, str]) -> str:
    """Put the original values back; unknown placeholders are left as they are."""
    if not secrets:
        return text
    return PLACEHOLDER_RE.sub(lambda match: secrets.get(match.group(0), match.group(0)), text)
