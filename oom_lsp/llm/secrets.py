"""Redact secrets before anything is sent, and put them back into the model's edits.

Each distinct secret becomes a numbered placeholder (`__REDACTED_1__`); the mapping
stays on this machine. The model quotes redacted lines in its SEARCH text, so the
placeholders are restored in SEARCH and REPLACE before matching: an edit that touches
such a line applies to the real text and keeps the real value.

What counts as a secret (docs/ai-fixes.md#privacy):
- the known key formats of detect-secrets, Yelp's maintained ruleset (AWS, Azure storage
  keys, URL credentials, Cloudant, Discord, GitHub, GitLab, IBM, JWTs, Mailchimp, npm,
  OpenAI, PyPI, SendGrid, Slack, SoftLayer, Square, Stripe, Telegram, Twilio,
  Artifactory) and its keyword rule (`password = "..."`); only its patterns are used,
  not its scanner. A match stops where the token does: some of its patterns match a
  fixed prefix of a longer key (Stripe's 24 characters, a JWT without its signature);
- formats and shapes it lacks: PEM private key blocks (it matches their first line),
  Google `AIza...`, Hugging Face `hf_`, OpenAI `sk-proj-`/Anthropic `sk-ant-`, Stripe
  test keys, `SharedAccessKey=`, the password of a URL with an empty user
  (`redis://:pw@host`);
- quoted values of 8 characters or more given to a name whose words include key,
  token, secret or password: assigned (`api_key = "..."`, `login(key="...")`,
  `{"hf_token": "..."}`), as the default of such an environment variable
  (`os.getenv("WANDB_API_KEY", "...")`) or command-line option
  (`add_argument("--hf-token", default="...")`), or written after one in a comment
  (`# token: abc...`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache

PLACEHOLDER_RE = re.compile(r"__REDACTED_\d+__")
MIN_VALUE_CHARS = 8  # "none", "test", "xxx" are no secrets worth hiding a line for
_LABEL = re.compile(r"[A-Za-z]+=")
_TOKEN_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.+/=~")
# detect-secrets plugins that are no key formats: IP addresses, and a private key's
# first line (the block rule below takes all of it); entropy rules would hide hashes.
_SKIPPED_PLUGINS = frozenset(
    {
        "IPPublicDetector",
        "PrivateKeyDetector",
        "Base64HighEntropyString",
        "HexHighEntropyString",
        "KeywordDetector",
    }
)
_PEM_BLOCK = re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?-----END [A-Z ]*PRIVATE KEY-----", re.DOTALL)
_OWN_FORMATS = (
    re.compile(r"\bAIza[0-9A-Za-z_-]{35}"),
    re.compile(r"\bhf_[A-Za-z0-9]{20,}"),
    re.compile(r"\bsk-(?:proj-|ant-(?:api\d+-)?)?[A-Za-z0-9_-]{20,}"),
    re.compile(r"\b[rsp]k_(?:live|test)_[0-9A-Za-z]{16,}"),
    re.compile(r"\bgithub_pat_[A-Za-z0-9_]{20,}"),
    re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"),
    re.compile(r"\b(?:AKIA|ASIA)[0-9A-Z]{16}\b"),
    re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"),
    re.compile(r"(?:AccountKey|SharedAccessKey|SharedAccessSignature)=(?P<secret>[A-Za-z0-9+/=%]{16,})"),
)
_URL_PASSWORD = re.compile(r"[a-z][a-z0-9+.-]*://[^\s:/@'\"]*:(?P<secret>[^\s@/'\"]+)(?=@)", re.I)
_SENSITIVE_WORDS = frozenset({"key", "apikey", "token", "secret", "password", "passwd", "pwd"})
_NAME_SEGMENT = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")
_VALUE = r"[rbuRBU]?(?P<quote>['\"])(?P<secret>[^'\"\n]{%d,})(?P=quote)" % MIN_VALUE_CHARS
_NAMED_VALUES = (
    # name = "value", name: str = "value", name="value" (keyword), "name": "value" (dict)
    re.compile(
        r"(?<![\w.])['\"]?(?P<name>[A-Za-z_][\w-]*)['\"]?\]?\s*(?::\s*[\w\[\]., ]+?\s*)?[:=]\s*" + _VALUE,
        re.IGNORECASE,
    ),
    # os.getenv("WANDB_API_KEY", "value"), os.environ.get(...), environ.setdefault(...)
    re.compile(
        r"(?:getenv|environ\.get|environ\.setdefault)\(\s*['\"](?P<name>[^'\"]+)['\"]\s*,\s*" + _VALUE
    ),
    # add_argument("--hf-token", ..., default="value")
    re.compile(r"add_argument\(\s*['\"](?P<name>[^'\"]+)['\"][^()]{0,300}?\bdefault\s*=\s*" + _VALUE),
    # a comment: "# HF token: hf-abc...", "# the password is hunter22"
    re.compile(
        r"#[^\n]*?\b(?P<name>[\w-]*(?:key|token|secret|password|passwd|pwd))\b[\"']?\s*(?:[:=]|\bis\b)\s*"
        r"(?P<secret>[^\s'\"]{%d,})" % MIN_VALUE_CHARS,
        re.IGNORECASE,
    ),
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

    text = _PEM_BLOCK.sub(lambda match: placeholder_for(match.group(0)), text)
    # Spans first, replaced from the end: a secret found by two rules is replaced once.
    spans = sorted(_spans(text), key=lambda span: (span[0], -span[1]))
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start < merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    # Numbered in reading order, replaced from the end so that the spans stay valid.
    names = [
        (start, end, placeholder_for(text[start:end]))
        for start, end in merged
        if not PLACEHOLDER_RE.fullmatch(text[start:end])
    ]
    for start, end, name in reversed(names):
        text = text[:start] + name + text[end:]
    return Redaction(text, mapping)


def _spans(text: str) -> Iterator[tuple[int, int]]:
    for pattern, group in _format_patterns():
        for match in pattern.finditer(text):
            start, end = _secret_span(match, group)
            span = _whole_token(text, start, end)
            if span[1] - span[0] >= MIN_VALUE_CHARS:
                yield span
    for match in _URL_PASSWORD.finditer(text):
        yield match.span("secret")
    for line_start, line in _lines(text):
        for value in _keyword_values(line):
            for found in re.finditer(re.escape(value), line):
                yield line_start + found.start(), line_start + found.end()
    for pattern in _NAMED_VALUES:
        for match in pattern.finditer(text):
            if _is_sensitive(match["name"]) and not PLACEHOLDER_RE.fullmatch(match["secret"]):
                yield match.span("secret")


def _secret_span(match: re.Match[str], group: str | None) -> tuple[int, int]:
    """The secret in a match of a key-format pattern: the named group of our patterns;
    for detect-secrets' patterns, the last group long enough to be a secret (the password
    of `://user:pw@`, the value after `aws_secret_key = `), else the whole match (a
    group there is a prefix such as `ghp`)."""
    if group is not None:
        return match.span(group)
    for index in range(len(match.groups()), 0, -1):
        value = match.group(index)
        if value and len(value) >= MIN_VALUE_CHARS:
            return match.span(index)
    return match.span()


def _whole_token(text: str, start: int, end: int) -> tuple[int, int]:
    """The span trimmed of delimiters a pattern matched around the token (a quote, a
    space), then grown to the whole run of token characters around it."""
    while start < end and text[start] not in _TOKEN_CHARS:
        start += 1
    while end > start and text[end - 1] not in _TOKEN_CHARS:
        end -= 1
    label = _LABEL.match(text, start, end)  # `AccountKey=` before the key: not secret
    if label is not None and end - label.end() >= MIN_VALUE_CHARS:
        start = label.end()
    while start > 0 and text[start - 1] in _TOKEN_CHARS and text[start - 1] not in "=:/":
        start -= 1
    while end < len(text) and text[end] in _TOKEN_CHARS:
        end += 1
    return start, end


def _lines(text: str) -> Iterator[tuple[int, str]]:
    offset = 0
    for line in text.splitlines(keepends=True):
        yield offset, line
        offset += len(line)


@lru_cache(maxsize=1)
def _format_patterns() -> tuple[tuple[re.Pattern[str], str | None], ...]:
    """Every key-format pattern: detect-secrets' regex plugins (whatever its version
    ships, less `_SKIPPED_PLUGINS`), then ours."""
    from detect_secrets.core.plugins.util import get_mapping_from_secret_type_to_class

    theirs = [
        (pattern, None)
        for plugin in get_mapping_from_secret_type_to_class().values()
        if plugin.__name__ not in _SKIPPED_PLUGINS
        for pattern in getattr(plugin, "denylist", ())
    ]
    ours = [(pattern, "secret" if "secret" in pattern.groupindex else None) for pattern in _OWN_FORMATS]
    return tuple(theirs + ours)


@lru_cache(maxsize=1)
def _keyword_detector() -> object:
    from detect_secrets.plugins.keyword import KeywordDetector

    return KeywordDetector()


def _keyword_values(line: str) -> list[str]:
    """detect-secrets' keyword rule, as for a Python file (quotes required)."""
    detector = _keyword_detector()
    return [
        value
        for value in detector.analyze_string(line)  # type: ignore[attr-defined]
        if len(value) >= MIN_VALUE_CHARS and not PLACEHOLDER_RE.search(value)
    ]


def _is_sensitive(name: str) -> bool:
    """`api_key`, `HF_TOKEN`, `apiKey`, `--hf-token`, `db-password`: yes; `tokenizer`, `keys_seen`: no."""
    return any(segment.lower() in _SENSITIVE_WORDS for segment in _NAME_SEGMENT.findall(name))


def restore(text: str, secrets: dict[str, str]) -> str:
    """Put the original values back; unknown placeholders are left as they are."""
    if not secrets:
        return text
    return PLACEHOLDER_RE.sub(lambda match: secrets.get(match.group(0), match.group(0)), text)
