"""The code-keyed registry of rules, and code selection (Ruff's semantics).

Meta codes that are not visitors (OOM000 invalid-syntax, OOM900
unused-suppression) are declared here so selection, docs and output know
them too.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from oom_lsp.analysis import catalogue
from oom_lsp.analysis.findings import Applicability, Severity

if TYPE_CHECKING:
    from oom_lsp.analysis.rule import Rule

_RULES: dict[str, type[Rule]] = {}
_CODE_RE = re.compile(r"^OOM\d{3}$")
_NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")


@dataclass(frozen=True)
class MetaRule:
    """A code the engine reports itself (no visitor)."""

    code: str
    name: str
    summary: str
    doc: str
    why: str
    remedy: str
    default_severity: Severity
    default_enabled: bool
    fix_applicability: Applicability | None = None

    def docs(self) -> str:
        return f"# {self.name} ({self.code})\n\n{self.summary}\n\n{self.doc.strip()}\n"


INVALID_SYNTAX = MetaRule(
    code="OOM000",
    name="invalid-syntax",
    summary="The file does not parse, so it could not be checked.",
    doc="""
## What it does
Reports a file that the Python parser rejects, at the parser's position and
with its message. The other files are still checked.

## Why is this bad?
No memory rule can run on code that does not parse; fixing the syntax error
lets oom-lsp check the file again.
""",
    why="No rule can check code that does not parse; the file is checked again as soon as it does.",
    remedy="Fix the syntax error.",
    default_severity=Severity.ERROR,
    default_enabled=True,
)

UNUSED_SUPPRESSION = MetaRule(
    code="OOM900",
    name="unused-suppression",
    summary="A suppression comment that suppresses nothing.",
    doc="""
## What it does
Reports `# oom: ignore[...]`, `# noqa: OOM...` and `# oom: ignore-file[...]`
codes that silence no finding, like Ruff's RUF100. Off by default: turn it on
with `--select OOM900` (or `select = ["OOM900", ...]`).

## Why is this bad?
A stale suppression hides the next real finding on that line.

## Example
```python
total = 0.0  # oom: ignore[OOM301]
```

## Interplay with Ruff
`ruff check --fix` with RUF102 enabled deletes `# noqa: OOM101` comments it
does not know. Keep them with:

```toml
[tool.ruff.lint]
external = ["OOM"]
```
""",
    why="A stale suppression hides the next real finding on its line.",
    remedy="Remove the codes that suppress nothing.",
    default_severity=Severity.WARNING,
    default_enabled=False,
    fix_applicability=Applicability.SAFE,
)

PREDICTED_OUT_OF_MEMORY = MetaRule(
    code="OOM100",
    name="predicted-out-of-memory",
    summary="An estimate of the training step's peak memory exceeds the target GPU at this batch size.",
    doc="""
## What it does
Reported by the language server after an estimate (the `oom-lsp.estimate`
command, or the "Estimate peak memory" code lens) predicts that a training
step of the script needs more memory than the target GPU has, on the batch-size
literal the estimate changed (an argparse `--batch-size` default, a
`DataLoader(batch_size=...)`, or the constant that feeds them). The static
analysis never reports it: it needs the fake-tensor run of `oom-lsp estimate`.
Any edit to the file removes it until the next estimate.

`oom-lsp check --budget SIZE` (the CI memory budget gate, or `budget` in
`[tool.oom-lsp]`) reports it too, on the same line, for each script of
`estimate-scripts` whose predicted peak (reserved memory and CUDA context)
exceeds the budget.

## Why is this bad?
The script will stop with `torch.OutOfMemoryError` in its first steps on that
GPU.

## Example
```python
parser.add_argument("--batch-size", type=int, default=512)  # ≈ 30.1 GiB at 512 / 24 GiB
```

## Use instead
The largest batch that fits (code action "Set batch size to N (largest that
fits)"), or that batch with gradient accumulation to keep the effective batch
("Use gradient accumulation (N x k)", which sets the micro-batch and adds a
`GRADIENT_ACCUMULATION_STEPS` constant for the training loop to use).
""",
    why="An estimate of the step (fake tensors, no GPU) needs more memory than the GPU has: the run would stop "
    "with torch.OutOfMemoryError in its first steps.",
    remedy="The largest batch that fits, with gradient accumulation to keep the effective batch.",
    default_severity=Severity.ERROR,
    default_enabled=True,
)

PREDICTED_MEMORY_GROWTH = MetaRule(
    code="OOM103",
    name="predicted-memory-growth",
    summary="The predicted peak memory of a training step grew more than allowed against the baseline.",
    doc="""
## What it does
Reported by the CI memory budget gate (`oom-lsp check --budget SIZE --baseline
FILE`, or `budget-baseline` in `[tool.oom-lsp]`) when a script of
`estimate-scripts` is predicted to need more than `budget-max-growth` percent
(default 5%) above the peak recorded for it in the baseline file, on the line
where the script sets its batch size. The static analysis never reports it: it
needs the fake-tensor run of `oom-lsp estimate`.

## Why is this bad?
A change that makes every step hold more memory (a larger model, a longer
sequence, a tensor kept across iterations) moves the nightly run towards an
out-of-memory failure long before it crosses the budget.

## Example
```text
train.py:13:59: OOM103 Predicted peak 488 MiB grew 10.3% over the baseline 442 MiB, limit 5% (train.py)
```

## Use instead
Find what grew (`oom-lsp estimate train.py` shows the top modules and lines at
the peak); when the growth is intended, record the new peak with
`oom-lsp check --update-baseline` and commit the baseline.

When the message says "tensors unchanged", the script's own tensors
peak where they did when the baseline was written: the growth is in what the
estimate adds around them (the CUDA context for the GPU and CUDA release, the
caching allocator's segments). That follows an upgrade of oom-lsp, PyTorch or
CUDA, not the change under review; record the new peak with
`oom-lsp check --update-baseline`.
""",
    why="The step is predicted to hold more memory than the baseline allows: the run moves towards an "
    "out-of-memory failure.",
    remedy="Find what grew with oom-lsp estimate, or record an intended growth with --update-baseline.",
    default_severity=Severity.ERROR,
    default_enabled=True,
)

META_RULES: dict[str, MetaRule] = {
    rule.code: rule
    for rule in (INVALID_SYNTAX, PREDICTED_OUT_OF_MEMORY, PREDICTED_MEMORY_GROWTH, UNUSED_SUPPRESSION)
}


def _check(rule: type[Rule]) -> None:
    if not _CODE_RE.match(rule.code):
        raise ValueError(f"{rule.__name__}: bad code {rule.code!r}")
    if not _NAME_RE.match(rule.name):
        raise ValueError(f"{rule.__name__}: name {rule.name!r} is not kebab-case")
    if rule.code in _RULES or rule.code in META_RULES:
        raise ValueError(f"duplicate rule code {rule.code}")


def _load() -> None:
    """Find the rules: every `Rule` subclass with a code, defined in a module of
    `oom_lsp.analysis.rules` (modules named `_*` hold shared helpers)."""
    if _RULES:
        return
    import importlib
    import pkgutil

    import oom_lsp.analysis.rules as package
    from oom_lsp.analysis.rule import Rule

    found: dict[str, type[Rule]] = {}
    for module_info in sorted(pkgutil.iter_modules(package.__path__), key=lambda info: info.name):
        if module_info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package.__name__}.{module_info.name}")
        for value in vars(module).values():
            if (
                isinstance(value, type)
                and issubclass(value, Rule)
                and value.__module__ == module.__name__
                and "code" in vars(value)
            ):
                if value.code in found:
                    raise ValueError(f"duplicate rule code {value.code}")
                found[value.code] = value
    for rule in found.values():
        _check(rule)
        _RULES[rule.code] = rule


def render_catalogue() -> str:
    """The text of `oom_lsp/analysis/catalogue.py`, generated from the rule classes and the meta rules."""
    rows = {code: (rule.name, rule.default_enabled) for code, rule in all_rules().items()}
    rows |= {code: (meta.name, meta.default_enabled) for code, meta in META_RULES.items()}
    lines = [f'    ("{code}", "{name}", {enabled}),' for code, (name, enabled) in sorted(rows.items())]
    return _CATALOGUE_TEMPLATE.format(rows="\n".join(lines))


_CATALOGUE_TEMPLATE = '''"""Every rule code, its name and whether it is on by default.

GENERATED from the rule classes (`oom_lsp/analysis/rules/`) and the meta rules
of `oom_lsp/analysis/registry.py` by
`python -m oom_lsp.analysis.registry --write-catalogue`; do not edit by hand
(tests/analysis/test_registry.py fails when it is stale).

This table is the public interface of RULES.md (codes never change meaning)
and it is readable without importing the rules themselves, which pull in
libcst: resolving a configuration and answering a run from the results cache
need only codes and names.
"""

from __future__ import annotations

# (code, name, enabled by default)
CATALOGUE: tuple[tuple[str, str, bool], ...] = (
{rows}
)

CODES: tuple[str, ...] = tuple(code for code, _, _ in CATALOGUE)
DEFAULT_CODES: tuple[str, ...] = tuple(code for code, _, enabled in CATALOGUE if enabled)
CODE_BY_NAME: dict[str, str] = {{name: code for code, name, _ in CATALOGUE}}
NAME_BY_CODE: dict[str, str] = {{code: name for code, name, _ in CATALOGUE}}
'''


def all_rules() -> dict[str, type[Rule]]:
    _load()
    return dict(sorted(_RULES.items()))


def rule_for(code: str) -> type[Rule] | MetaRule | None:
    _load()
    return _RULES.get(code) or META_RULES.get(code)


def rule_by_name(name: str) -> type[Rule] | MetaRule | None:
    code = catalogue.CODE_BY_NAME.get(name)
    return rule_for(code) if code is not None else None


# Codes and selection come from the catalogue: no rule module (no libcst) is
# imported to resolve a configuration.


def all_codes() -> list[str]:
    return sorted(catalogue.CODES)


def default_codes() -> list[str]:
    return sorted(catalogue.DEFAULT_CODES)


class SelectorError(ValueError):
    """A code or prefix in select/ignore that matches no rule."""


def expand_selector(selector: str) -> set[str]:
    """Codes matched by `OOM301`, a prefix (`OOM3`, `OOM`), `ALL` or a rule name."""
    selector = selector.strip()
    if selector.upper() == "ALL":
        return set(all_codes())
    by_name = catalogue.CODE_BY_NAME.get(selector)
    if by_name is not None:
        return {by_name}
    matched = {code for code in all_codes() if code.startswith(selector.upper())}
    if not matched or not selector.upper().startswith("OOM"):
        raise SelectorError(f"unknown rule selector {selector!r}")
    return matched


def resolve_selection(
    select: list[str] | None,
    ignore: list[str] = (),  # type: ignore[assignment]
    extend_select: list[str] = (),  # type: ignore[assignment]
) -> frozenset[str]:
    """Ruff's semantics: `select` replaces the default set, then
    `extend-select` adds and `ignore` removes. An explicitly named
    default-off rule (OOM900) is on only when a selector names it or its prefix.
    """
    if select is None:
        enabled = set(default_codes())
    else:
        enabled = set()
        for selector in select:
            enabled |= expand_selector(selector)
    for selector in extend_select:
        enabled |= expand_selector(selector)
    for selector in ignore:
        enabled -= expand_selector(selector)
    return frozenset(enabled)


if __name__ == "__main__":
    import sys
    from pathlib import Path

    if sys.argv[1:] != ["--write-catalogue"]:
        sys.exit("usage: python -m oom_lsp.analysis.registry --write-catalogue")
    Path(catalogue.__file__).write_text(render_catalogue(), encoding="utf-8")
