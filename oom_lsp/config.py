"""Configuration: `[tool.oom-lsp]` in pyproject.toml, CLI flags and editor
settings, resolved into one typed `ProjectConfig` per directory.

Ruff's contract throughout: the nearest pyproject.toml with a `[tool.oom-lsp]`
table applies to a file, keys are kebab-case (editor settings may use
camelCase), `select` replaces the default rule set, `extend-select` adds,
`ignore` removes, and per-file-ignores globs are relative to the folder of
the pyproject. A broken configuration is a `ConfigError` whose message names
the file and the key; the CLI turns it into exit code 2.

Layering (`ConfigResolver`): command-line overrides win over the pyproject;
editor settings fill only what the pyproject leaves unsaid, so the editor and
CI agree on the rule set of a project that configures one.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import math
import os
import re
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from oom_lsp.analysis import registry
from oom_lsp.analysis.findings import Severity
from oom_lsp.analysis.settings import LintSettings

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

TOOL_TABLE = "oom-lsp"
DEFAULT_MAX_BATCH_SIZE = 32
# Larger files are not analysed (reported instead): a 1 MiB file took 44 s and 700 MB of
# memory, a 2 MiB one 88 s and 1.4 GB, on a loaded 2-core machine.
DEFAULT_MAX_FILE_SIZE = 2**20

# The files a folder's walk checks, as Ruff's default `include`: Python sources and
# Jupyter notebooks.
DEFAULT_INCLUDE: tuple[str, ...] = ("*.py", "*.pyi", "*.ipynb")

# Folders never worth descending into, as Ruff's default `exclude`.
DEFAULT_EXCLUDE: tuple[str, ...] = (
    ".bzr",
    ".direnv",
    ".eggs",
    ".git",
    ".git-rewrite",
    ".hg",
    ".ipynb_checkpoints",
    ".mypy_cache",
    ".nox",
    ".oom_lsp_cache",
    ".pants.d",
    ".pyenv",
    ".pytest_cache",
    ".pytype",
    ".ruff_cache",
    ".svn",
    ".tox",
    ".venv",
    ".vscode",
    "__pypackages__",
    "__pycache__",
    "_build",
    "buck-out",
    "build",
    "dist",
    "node_modules",
    "site-packages",
    "venv",
)


class ConfigError(Exception):
    """A configuration problem, located by its origin (file and table) and key."""

    def __init__(self, origin: str, key: str | None, problem: str) -> None:
        self.origin = origin
        self.key = key
        self.problem = problem
        where = f"{origin} {key}" if key else origin
        super().__init__(f"{where}: {problem}")


# --- Glob matching ------------------------------------------------------------


def _glob_to_regex(pattern: str) -> str:
    """Translate a gitignore-style glob: `*` and `?` stay inside one path
    segment, `**` crosses segments, `[...]` is a character class."""
    out = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if pattern.startswith("**/", index):
            out.append("(?:.*/)?")
            index += 3
            continue
        if pattern.startswith("**", index):
            out.append(".*")
            index += 2
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            close = pattern.find("]", index + 1)
            if close == -1:
                out.append(re.escape(char))
            else:
                body = pattern[index + 1 : close]
                if body.startswith("!"):
                    body = "^" + body[1:]
                out.append("[" + body.replace("\\", "\\\\") + "]")
                index = close
        else:
            out.append(re.escape(char))
        index += 1
    return "".join(out)


@dataclass(frozen=True)
class GlobPattern:
    """A glob as Ruff reads `exclude` and `per-file-ignores`: with a `/` it is
    matched against the path relative to the project root; without one, against
    the file or folder name, wherever it is."""

    pattern: str

    @cached_property
    def _regex(self) -> re.Pattern[str]:
        text = self.pattern.strip().rstrip("/")
        text = text.removeprefix("./")
        return re.compile(_glob_to_regex(text.lstrip("/")) + r"\Z", re.DOTALL)

    @cached_property
    def _by_name(self) -> bool:
        return "/" not in self.pattern.strip().rstrip("/")

    def matches(self, relative: str) -> bool:
        """`relative`: a POSIX path relative to the root (or an absolute one
        for a path outside it)."""
        if self._by_name:
            return self._regex.match(relative.rsplit("/", 1)[-1]) is not None
        return self._regex.match(relative) is not None or self._regex.match(relative.lstrip("/")) is not None


def relative_posix(path: Path, root: Path) -> str:
    """`path` relative to `root` in POSIX form; absolute when outside it."""
    absolute = Path(os.path.abspath(path))
    try:
        return absolute.relative_to(os.path.abspath(root)).as_posix()
    except ValueError:
        return absolute.as_posix()


# --- Values -------------------------------------------------------------------

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def parse_memory_size(value: str | int) -> int:
    """Bytes from "24GiB", "24 GB", "24000MiB" or an integer byte count.

    `GB`/`MB` are decimal (10**9, 10**6), `GiB`/`MiB` binary (2**30, 2**20):
    `nvidia-smi` reports MiB, marketing sheets GB.
    """
    if isinstance(value, bool):
        raise TypeError('expected a size such as "24GiB", got a boolean')
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"expected a positive number of bytes, got {value}")
        return value
    match = _SIZE_RE.match(value)
    if not match:
        raise ValueError(f'expected a size such as "24GiB", "24 GB" or "24000MiB", got {value!r}')
    number = float(match.group(1))
    unit = (match.group(2) or "B").lower()
    size = int(number * _SIZE_UNITS[unit])
    if size <= 0:
        raise ValueError(f"expected a positive size, got {value!r}")
    return size


def _type_name(value: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


def _kebab(key: str) -> str:
    """`maxBatchSize` -> `max-batch-size`; kebab-case keys are unchanged."""
    return re.sub(r"(?<=[a-z0-9])([A-Z])", r"-\1", key).lower() if key != key.lower() else key


def _unknown_key(origin: str, key: str, known: list[str], prefix: str) -> ConfigError:
    close = difflib.get_close_matches(_kebab(key).replace("_", "-"), known, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else f"; known keys: {', '.join(known)}"
    return ConfigError(origin, prefix + key, f"unknown key{hint}")


def _normalize_keys(table: dict[str, Any], origin: str, known: list[str], prefix: str = "") -> dict[str, Any]:
    """Kebab-case keys; camelCase accepted; unknown or duplicate keys rejected."""
    normalized: dict[str, Any] = {}
    for key, value in table.items():
        if not isinstance(key, str):
            raise ConfigError(origin, prefix + str(key), "keys must be strings")
        kebab = _kebab(key)
        if kebab not in known:
            raise _unknown_key(origin, key, known, prefix)
        if kebab in normalized:
            raise ConfigError(origin, prefix + key, f"given twice (also as '{kebab}')")
        normalized[kebab] = value
    return normalized


def _string_list(origin: str, key: str, value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        # Editor settings and shells give a comma-separated string.
        value = [part for part in value.split(",")]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(origin, key, f"expected an array of strings, got {_type_name(value)}")
    return tuple(item.strip() for item in value if item.strip())


def _selectors(origin: str, key: str, value: object) -> tuple[str, ...]:
    selectors = _string_list(origin, key, value)
    for selector in selectors:
        try:
            registry.expand_selector(selector)
        except registry.SelectorError as error:
            raise ConfigError(origin, key, str(error)) from None
    return selectors


def _bool(origin: str, key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(origin, key, f"expected a boolean, got {_type_name(value)}")
    return value


def _positive_int(origin: str, key: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(origin, key, f"expected a positive integer, got {value!r}")
    return value


def _severity_table(origin: str, key: str, value: object) -> dict[str, Severity]:
    if not isinstance(value, dict):
        raise ConfigError(origin, key, f"expected a table of code = severity, got {_type_name(value)}")
    choices = ", ".join(severity.value for severity in Severity)
    severities: dict[str, Severity] = {}
    for selector, level in value.items():
        entry_key = f"{key}.{selector}"
        try:
            registry.expand_selector(selector)
        except registry.SelectorError as error:
            raise ConfigError(origin, entry_key, str(error)) from None
        if not isinstance(level, str) or level.lower() not in {severity.value for severity in Severity}:
            raise ConfigError(origin, entry_key, f"expected one of {choices}, got {level!r}")
        severities[selector] = Severity(level.lower())
    return severities


def _per_file_ignores(origin: str, key: str, value: object) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict):
        raise ConfigError(origin, key, f"expected a table of glob = [codes], got {_type_name(value)}")
    return {glob: _selectors(origin, f"{key}.{glob!r}", codes) for glob, codes in value.items()}


def _memory(origin: str, key: str, value: object) -> int:
    if not isinstance(value, (str, int)):
        raise ConfigError(origin, key, f'expected a size such as "24GiB", got {_type_name(value)}')
    try:
        return parse_memory_size(value)
    except (TypeError, ValueError) as error:
        raise ConfigError(origin, key, str(error)) from None


def _gpus_table(origin: str, key: str, value: object) -> dict[str, int]:
    """Extra GPUs for `--gpu NAME` and the editor: name = memory size."""
    if not isinstance(value, dict):
        raise ConfigError(origin, key, f'expected a table of name = "24GiB", got {_type_name(value)}')
    return {str(name): _memory(origin, f"{key}.{name!r}", size) for name, size in value.items()}


def parse_percent(value: object) -> float:
    """A percentage from 5, 2.5, "5%" or "5 %" (a number is taken as percent, not a share)."""
    if isinstance(value, bool):
        raise TypeError('expected a percentage such as 5 or "5%", got a boolean')
    if isinstance(value, str):
        text = value.strip().removesuffix("%").strip()
        try:
            number = float(text)
        except ValueError:
            raise ValueError(f'expected a percentage such as 5 or "5%", got {value!r}') from None
    elif isinstance(value, (int, float)):
        number = float(value)
    else:
        raise TypeError(f'expected a percentage such as 5 or "5%", got {_type_name(value)}')
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"expected a percentage of 0 or more, got {value!r}")
    return number


def _percent(origin: str, key: str, value: object) -> float:
    try:
        return parse_percent(value)
    except (TypeError, ValueError) as error:
        raise ConfigError(origin, key, str(error)) from None


def _seconds(origin: str, key: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ConfigError(origin, key, f"expected a positive number of seconds, got {value!r}")
    return float(value)


def _path_string(origin: str, key: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(origin, key, f"expected a file path, got {value!r}")
    return value


def split_command(entry: str) -> list[str]:
    """`train.py --epochs 1` as a POSIX shell splits it; raises ValueError for unbalanced
    quotes or an empty entry."""
    words = shlex.split(entry)
    if not words:
        raise ValueError("expected a script and its arguments, got an empty string")
    return words


def _command_list(origin: str, key: str, value: object) -> tuple[str, ...]:
    """Each entry a script and its arguments, split as a shell does (checked here, split again
    where it runs: the entry as written is its name in the budget baseline)."""
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ConfigError(
            origin,
            key,
            f'expected an array of strings such as ["train.py --epochs 1"], got {_type_name(value)}',
        )
    for index, entry in enumerate(value):
        try:
            split_command(entry)
        except ValueError as error:
            raise ConfigError(origin, f"{key}[{index}]", f"{error} ({entry!r})") from None
    return tuple(entry.strip() for entry in value)


LLM_KEYS = ["enabled", "base-url", "model", "api-key-env", "timeout", "response-format", "fix-log"]
LLM_RESPONSE_FORMATS = ("text", "json_schema")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def _llm_table(origin: str, key: str, value: object) -> dict[str, Any]:
    """Type-checked only: the LLM feature owns the meaning of each key (and
    oom_lsp.llm.settings decides which source may set which)."""
    if not isinstance(value, dict):
        raise ConfigError(origin, key, f"expected a table, got {_type_name(value)}")
    table = _normalize_keys(value, origin, LLM_KEYS, prefix=f"{key}.")
    for name, item in table.items():
        entry_key = f"{key}.{name}"
        if name == "enabled":
            _bool(origin, entry_key, item)
        elif name == "timeout":
            # nan passes `<= 0` and inf never times out: both would hang a request forever.
            if (
                isinstance(item, bool)
                or not isinstance(item, (int, float))
                or not math.isfinite(item)
                or item <= 0
            ):
                raise ConfigError(origin, entry_key, f"expected a positive number of seconds, got {item!r}")
        elif not isinstance(item, str):
            raise ConfigError(origin, entry_key, f"expected a string, got {_type_name(item)}")
        elif not item.strip():
            raise ConfigError(origin, entry_key, "expected a value, got an empty string")
        elif name == "response-format" and item not in LLM_RESPONSE_FORMATS:
            raise ConfigError(
                origin, entry_key, f"expected one of {', '.join(LLM_RESPONSE_FORMATS)}, got {item!r}"
            )
        elif name == "base-url" and urlparse(item).scheme not in ("http", "https"):
            raise ConfigError(
                origin, entry_key, f"expected an http:// or https:// URL such as http://localhost:11434/v1, got {item!r}"
            )
        elif name == "api-key-env" and not _ENV_NAME_RE.match(item):
            raise ConfigError(
                origin, entry_key, f"expected the name of an environment variable (OPENAI_API_KEY), got {item!r}"
            )
    return table


def validate_llm_table(table: object, origin: str) -> dict[str, Any]:
    """An `llm` table from editor settings (`oomLsp.llm`), kebab-case keys; raises ConfigError."""
    return _llm_table(origin, "llm", table)


_PARSERS: dict[str, Callable[[str, str, Any], Any]] = {
    "select": _selectors,
    "extend-select": _selectors,
    "ignore": _selectors,
    "per-file-ignores": _per_file_ignores,
    "include": _string_list,
    "extend-include": _string_list,
    "exclude": _string_list,
    "extend-exclude": _string_list,
    "respect-gitignore": _bool,
    "max-batch-size": _positive_int,
    # Every finding the rules can prove, also where the memory at stake is not
    # shown to matter (the default shows only those that are).
    "strict": _bool,
    "max-file-size": _memory,
    "severity": _severity_table,
    "gpu-memory": _memory,
    "gpus": _gpus_table,
    # The CI memory budget gate of `oom-lsp check` (oom_lsp/usecases/budget.py).
    "budget": _memory,
    "budget-baseline": _path_string,
    "budget-max-growth": _percent,
    "estimate-scripts": _command_list,
    "estimate-timeout": _seconds,
    "llm": _llm_table,
}
KNOWN_KEYS = sorted(_PARSERS)


_LIST_KEYS = frozenset(key for key, parser in _PARSERS.items() if parser in (_string_list, _selectors))


def _no_string_for_a_list(origin: str, key: str, value: object) -> None:
    """In a TOML file a list is an array: `select = "OOM301"` is a mistake to name (editor
    settings and shells may give a comma-separated string; a file has no such reason)."""
    if isinstance(value, str):
        raise ConfigError(origin, key, f"expected an array of strings such as {json.dumps([value])}, got a string")


def validate_table(table: dict[str, Any], origin: str, *, from_file: bool = False) -> dict[str, Any]:
    """The table with kebab-case keys and typed values; raises ConfigError. `from_file`: a
    TOML file's table, where a list must be an array."""
    if not isinstance(table, dict):
        raise ConfigError(origin, None, f"expected a table, got {_type_name(table)}")
    normalized = _normalize_keys(table, origin, KNOWN_KEYS)
    if from_file:
        for key in _LIST_KEYS & normalized.keys():
            _no_string_for_a_list(origin, key, normalized[key])
    return {key: _PARSERS[key](origin, key, value) for key, value in normalized.items()}


# --- The resolved configuration -------------------------------------------------


@dataclass(frozen=True)
class RuleSelection:
    """One layer of select / extend-select / ignore, as Ruff layers the CLI
    over the configuration file: a layer with `select` starts afresh."""

    select: tuple[str, ...] | None = None
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()

    def is_empty(self) -> bool:
        return self.select is None and not self.extend_select and not self.ignore

    def apply(self, enabled: frozenset[str]) -> frozenset[str]:
        if self.select is not None:
            return registry.resolve_selection(list(self.select), list(self.ignore), list(self.extend_select))
        codes = set(enabled)
        for selector in self.extend_select:
            codes |= registry.expand_selector(selector)
        for selector in self.ignore:
            codes -= registry.expand_selector(selector)
        return frozenset(codes)


@dataclass(frozen=True)
class ProjectConfig:
    path: Path | None  # the pyproject.toml (or --config file); None: defaults only
    root: Path  # its folder: per-file-ignores and exclude globs are relative to it
    select: tuple[str, ...] | None = None
    extend_select: tuple[str, ...] = ()
    ignore: tuple[str, ...] = ()
    per_file_ignores: dict[str, tuple[str, ...]] = field(default_factory=dict)
    include: tuple[str, ...] = DEFAULT_INCLUDE
    extend_include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE
    extend_exclude: tuple[str, ...] = ()
    respect_gitignore: bool = True
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE
    strict: bool = False
    max_file_size: int = DEFAULT_MAX_FILE_SIZE  # bytes; larger files are reported, not analysed
    severity: dict[str, Severity] = field(default_factory=dict)
    gpu_memory: int | None = None
    gpus: dict[str, int] = field(default_factory=dict)  # name -> bytes, beside the built-in catalogue
    # The budget gate (`oom-lsp check --budget`): paths relative to `root`.
    budget: int | None = None
    budget_baseline: str | None = None
    budget_max_growth: float | None = None  # percent
    estimate_scripts: tuple[str, ...] = ()
    estimate_timeout: float | None = None
    llm: dict[str, Any] = field(default_factory=dict)
    # Command-line --select/--extend-select/--ignore, applied after the above.
    overrides: RuleSelection = field(default_factory=RuleSelection)

    @cached_property
    def enabled(self) -> frozenset[str]:
        """Rule codes enabled before per-file-ignores."""
        enabled = RuleSelection(self.select, self.extend_select, self.ignore).apply(
            frozenset(registry.default_codes())
        )
        return self.overrides.apply(enabled)

    @cached_property
    def _severity_by_code(self) -> dict[str, Severity]:
        # A code's own entry beats its prefix's: apply the shortest selectors first.
        resolved: dict[str, Severity] = {}
        for selector in sorted(self.severity, key=len):
            for code in registry.expand_selector(selector):
                resolved[code] = self.severity[selector]
        return resolved

    @cached_property
    def _per_file_patterns(self) -> list[tuple[GlobPattern, frozenset[str]]]:
        return [
            (
                GlobPattern(glob),
                frozenset(code for selector in codes for code in registry.expand_selector(selector)),
            )
            for glob, codes in self.per_file_ignores.items()
        ]

    @cached_property
    def _include_patterns(self) -> list[GlobPattern]:
        return [GlobPattern(glob) for glob in (*self.include, *self.extend_include)]

    @cached_property
    def _exclude_patterns(self) -> list[GlobPattern]:
        return [GlobPattern(glob) for glob in (*self.exclude, *self.extend_exclude)]

    @cached_property
    def _settings_cache(self) -> dict[frozenset[str], LintSettings]:
        return {}

    def ignored_codes_for(self, file: Path) -> frozenset[str]:
        relative = relative_posix(file, self.root)
        ignored: set[str] = set()
        for pattern, codes in self._per_file_patterns:
            if pattern.matches(relative):
                ignored |= codes
        return frozenset(ignored)

    def settings_for(self, file: Path) -> LintSettings:
        """The settings `file` is analysed with."""
        ignored = self.ignored_codes_for(file) if self.per_file_ignores else frozenset()
        settings = self._settings_cache.get(ignored)
        if settings is None:
            settings = LintSettings(
                enabled=self.enabled - ignored,
                severity=dict(self._severity_by_code),
                max_batch_size=self.max_batch_size,
                strict=self.strict,
            )
            self._settings_cache[ignored] = settings
        return settings

    def is_included(self, file: Path) -> bool:
        """Whether `include`/`extend-include` matches `file`: a folder's walk checks
        the files that match (and that no `exclude` glob matches)."""
        relative = relative_posix(file, self.root)
        return any(pattern.matches(relative) for pattern in self._include_patterns)

    def is_excluded(self, path: Path) -> bool:
        """Whether `exclude`/`extend-exclude` matches `path` (a file or a folder)."""
        relative = relative_posix(path, self.root)
        return any(pattern.matches(relative) for pattern in self._exclude_patterns)


_FIELD_OF_KEY = {key: key.replace("-", "_") for key in KNOWN_KEYS}


def parse_config_table(
    table: dict[str, Any], origin: str, root: Path, path: Path | None = None
) -> ProjectConfig:
    """A ProjectConfig from a `[tool.oom-lsp]`-shaped table. Pure.

    `origin` prefixes error messages, e.g. "pyproject.toml: [tool.oom-lsp]"
    or "editor settings"; `path`: the file the table is from."""
    values = validate_table(table, origin, from_file=path is not None)
    return _config_from_values(values, root, path)


def _config_from_values(values: dict[str, Any], root: Path, path: Path | None) -> ProjectConfig:
    return ProjectConfig(path=path, root=root, **{_FIELD_OF_KEY[key]: value for key, value in values.items()})


def _display(path: Path) -> str:
    """`path` as the user most likely typed it: relative when below the current folder."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)
    return str(path) if relative.startswith("..") else relative


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as error:
        raise ConfigError(_display(path), None, f"cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(
            _display(path), None, f"not valid UTF-8 ({error.reason} at byte {error.start})"
        ) from None
    try:
        return _parse_toml(text)
    except tomllib.TOMLDecodeError as error:
        # tomllib's message ends with "(at line L, column C)".
        raise ConfigError(_display(path), None, f"invalid TOML: {error}") from None


def _parse_toml(text: str) -> dict[str, Any]:
    """tomllib's parse; its recursive descent overflows the stack on arrays or
    inline tables nested ~1,000 deep, which no configuration needs."""
    try:
        return tomllib.loads(text)
    except RecursionError:
        raise tomllib.TOMLDecodeError("arrays or inline tables nested too deeply") from None


def _tool_table(document: dict[str, Any]) -> Any:
    tool = document.get("tool")
    return tool.get(TOOL_TABLE) if isinstance(tool, dict) else None


def _file_table(path: Path) -> tuple[dict[str, Any], str]:
    """The raw oom-lsp table of a configuration file and its error origin.

    A pyproject.toml holds it under `[tool.oom-lsp]`; any other TOML file
    (`oom-lsp.toml`, passed with --config) is the table itself."""
    document = _read_toml(path)
    if path.name == "pyproject.toml":
        table = _tool_table(document)
        origin = f"{_display(path)}: [tool.{TOOL_TABLE}]"
        if table is None:
            return {}, origin
        if not isinstance(table, dict):
            raise ConfigError(origin, None, f"expected a table, got {_type_name(table)}")
        return table, origin
    return document, _display(path)


def load_config(pyproject: Path) -> ProjectConfig:
    """The configuration in `pyproject` (its `[tool.oom-lsp]` table)."""
    table, origin = _file_table(pyproject)
    return parse_config_table(table, origin, pyproject.parent.resolve(), pyproject)


def _has_tool_table(pyproject: Path) -> bool:
    try:
        raw = pyproject.read_bytes()
    except OSError:
        return False
    if TOOL_TABLE.encode() not in raw:
        return False  # the common case, without parsing the file
    # A broken pyproject that mentions the tool is the user's config: let
    # load_config report it rather than silently skipping to a parent.
    try:
        document = _parse_toml(raw.decode("utf-8", errors="replace"))
    except tomllib.TOMLDecodeError:
        return True
    return _tool_table(document) is not None


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml at or above `start` (a file or a folder)
    that has a `[tool.oom-lsp]` table; pyprojects without one are skipped."""
    start = Path(os.path.abspath(start))
    folder = start if start.is_dir() else start.parent
    for candidate_dir in (folder, *folder.parents):
        candidate = candidate_dir / "pyproject.toml"
        if _is_file(candidate) and _has_tool_table(candidate):
            return candidate
    return None


def _is_file(path: Path) -> bool:
    """`Path.is_file`, False for a file in a folder that cannot be searched
    (pathlib raises PermissionError there): such a folder cannot hold the
    configuration of the files below it either, since they cannot be read."""
    try:
        return path.is_file()
    except OSError:
        return False


class ConfigResolver:
    """Resolves the configuration of each file, cached per folder.

    overrides: command-line values (kebab-case keys); they win over the file.
    defaults: editor settings (camelCase or kebab-case); used only for keys the
        pyproject does not set. A project that sets any of select /
        extend-select / ignore owns the rule selection entirely.
    config_file: `--config`; replaces discovery for every file.
    fallback_root: the root of files no pyproject covers (default: the
        current folder).
    """

    _SELECTION_KEYS = ("select", "extend-select", "ignore")

    def __init__(
        self,
        overrides: dict[str, Any] | None = None,
        defaults: dict[str, Any] | None = None,
        config_file: Path | None = None,
        *,
        fallback_root: Path | None = None,
    ) -> None:
        self._overrides = validate_table(overrides or {}, "command line")
        self._defaults = validate_table(defaults or {}, "editor settings")
        self._config_file = Path(os.path.abspath(config_file)) if config_file is not None else None
        self._fallback_root = Path(os.path.abspath(fallback_root or Path.cwd()))
        self._by_folder: dict[Path, ProjectConfig] = {}
        self._by_file: dict[Path | None, ProjectConfig] = {}
        if self._config_file is not None and not self._config_file.is_file():
            raise ConfigError(_display(self._config_file), None, "no such configuration file")

    def invalidate(self) -> None:
        """Forget every resolved configuration (a pyproject.toml changed)."""
        self._by_folder.clear()
        self._by_file.clear()

    def resolve(self, file: Path) -> ProjectConfig:
        """The configuration for `file`."""
        return self.resolve_folder(Path(os.path.abspath(file)).parent)

    def resolve_folder(self, folder: Path) -> ProjectConfig:
        """The configuration for the files in `folder`."""
        folder = Path(os.path.abspath(folder))
        config = self._by_folder.get(folder)
        if config is not None:
            return config
        if self._config_file is not None:
            config = self._config_at(self._config_file)
            self._by_folder[folder] = config
            return config
        # Walk up until a folder already resolved or a pyproject with the
        # table; every folder passed on the way shares the answer, so a tree
        # walk reads each pyproject.toml once.
        passed = []
        current = folder
        while True:
            known = self._by_folder.get(current)
            if known is not None:
                config = known
                break
            passed.append(current)
            candidate = current / "pyproject.toml"
            if _is_file(candidate) and _has_tool_table(candidate):
                config = self._config_at(candidate)
                break
            if current.parent == current:
                config = self._config_at(None)
                break
            current = current.parent
        for visited in passed:
            self._by_folder[visited] = config
        return config

    def _config_at(self, config_path: Path | None) -> ProjectConfig:
        config = self._by_file.get(config_path)
        if config is None:
            config = self._by_file[config_path] = self._build(config_path)
        return config

    def _build(self, config_path: Path | None) -> ProjectConfig:
        if config_path is None:
            file_values: dict[str, Any] = {}
            root = self._fallback_root
        else:
            table, origin = _file_table(config_path)
            file_values = validate_table(table, origin, from_file=True)
            root = config_path.parent
        values = dict(file_values)
        project_selects = any(key in file_values for key in self._SELECTION_KEYS)
        for key, value in self._defaults.items():
            if key in self._SELECTION_KEYS and project_selects:
                continue
            values.setdefault(key, value)
        overrides = RuleSelection(
            select=self._overrides.get("select"),
            extend_select=self._overrides.get("extend-select", ()),
            ignore=self._overrides.get("ignore", ()),
        )
        for key, value in self._overrides.items():
            if key not in self._SELECTION_KEYS:
                values[key] = value
        config = _config_from_values(values, root, config_path)
        if overrides.is_empty():
            return config
        return dataclasses.replace(config, overrides=overrides)


# --- The user's own configuration ------------------------------------------------

USER_CONFIG_KEYS = ["llm", "trusted-projects"]


@dataclass(frozen=True)
class UserConfig:
    """`~/.config/oom-lsp/config.toml`: what only the user decides, whatever
    project is open (docs/ai-fixes.md#security). `llm` has the keys of
    `[tool.oom-lsp.llm]`; `trusted_projects` are the folders whose own
    pyproject.toml may set them too."""

    path: Path | None = None
    llm: dict[str, Any] = field(default_factory=dict)
    trusted_projects: tuple[Path, ...] = ()

    def trusts(self, project_root: Path) -> bool:
        """Whether the configuration file in `project_root` is the user's.
        Only the listed folder itself: a repository cloned below a trusted one
        brings its own pyproject.toml, which is not the user's."""
        root = Path(os.path.realpath(project_root))
        return any(Path(os.path.realpath(trusted)) == root for trusted in self.trusted_projects)


def user_config_path(environ: dict[str, str] | None = None) -> Path:
    """`$XDG_CONFIG_HOME/oom-lsp/config.toml` (default `~/.config`), or
    `%APPDATA%\\oom-lsp\\config.toml` on Windows."""
    environ = dict(os.environ) if environ is None else environ
    if sys.platform == "win32" and environ.get("APPDATA"):
        return Path(environ["APPDATA"]) / TOOL_TABLE / "config.toml"
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / TOOL_TABLE / "config.toml"


def parse_user_config(table: dict[str, Any], origin: str, path: Path | None = None) -> UserConfig:
    normalized = _normalize_keys(table, origin, USER_CONFIG_KEYS)
    _no_string_for_a_list(origin, "trusted-projects", normalized.get("trusted-projects", []))
    llm = _llm_table(origin, "llm", normalized.get("llm", {}))
    folders = _string_list(origin, "trusted-projects", normalized.get("trusted-projects", []))
    return UserConfig(path, llm, tuple(Path(os.path.expanduser(folder)) for folder in folders))


_user_config_cache: dict[Path, tuple[tuple[int, int], UserConfig]] = {}


def load_user_config(path: Path | None = None) -> UserConfig:
    """The user's configuration (empty when the file does not exist); raises
    ConfigError for a broken one. Re-read when the file changes."""
    path = path or user_config_path()
    try:
        stat = path.stat()
    except OSError:
        return UserConfig()
    stamp = (stat.st_mtime_ns, stat.st_size)
    cached = _user_config_cache.get(path)
    if cached is not None and cached[0] == stamp:
        return cached[1]
    config = parse_user_config(_read_toml(path), _display(path), path)
    _user_config_cache[path] = (stamp, config)
    return config
