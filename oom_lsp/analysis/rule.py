"""What a rule is: a batched libcst visitor that carries its own docs and tests.

A rule subclasses `Rule`, sets its class attributes (code, kebab-case name, a
one-line summary, its default severity, whether and how safely it fixes) and
lists `VALID` and `INVALID` examples. The examples are its unit tests
(`tests/analysis/test_rule_examples.py` generates them) and its documentation
(`oom-lsp rule CODE`, hover in the editor). Its docstring has the sections of
Ruff's rule docs: "What it does", "Why is this bad?" (what grows in memory),
"Example", "Use instead", and "Fix safety" when it fixes.

A rule reports a node; it never computes positions. The engine turns reported
nodes into ranges and edits afterwards, only for files that have findings.
"""

from __future__ import annotations

import inspect
import textwrap
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import libcst as cst

from oom_lsp.analysis.findings import Applicability, Severity
from oom_lsp.edits import NodeEdit

if TYPE_CHECKING:
    from oom_lsp.analysis.context import FileContext


@dataclass(frozen=True)
class Valid:
    """Code the rule must not report."""

    code: str
    # Per-example settings, e.g. {"max_batch_size": 64}.
    settings: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Invalid:
    """Code the rule must report.

    `line` is the 1-based line of the report in the dedented example;
    `expected_fix` the whole example after applying the rule's fix (unsafe
    fixes included), or None when the example has no fix.
    """

    code: str
    line: int | None = None
    expected_fix: str | None = None
    settings: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class FixSpec:
    """A fix in terms of nodes (edits from `oom_lsp.fixes`); the engine
    resolves their positions and turns each into a TextEdit."""

    title: str
    edits: tuple[NodeEdit, ...]
    applicability: Applicability
    # Modules that must be importable under the name the edits use, e.g.
    # ("torch",) adds `import torch` when the file has no binding for it.
    imports: tuple[str, ...] = ()


@dataclass
class Report:
    rule: type[Rule]
    node: cst.CSTNode
    message: str
    fix: FixSpec | None
    statement: cst.CSTNode | None
    # The enclosing statements, outermost first (for lazy positions).
    statement_path: tuple[cst.CSTNode, ...] = ()


class Rule(cst.BatchableCSTVisitor):
    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    default_severity: ClassVar[Severity] = Severity.WARNING
    # None: the rule never fixes. Otherwise the safety of its fix.
    fix_applicability: ClassVar[Applicability | None] = None
    # Rules off unless selected explicitly (a prefix or ALL selects them too).
    default_enabled: ClassVar[bool] = True
    # Runs on a notebook's cells only (oom_lsp.notebooks); its examples are notebooks
    # in the percent format (`# %%` starts a cell).
    notebook_only: ClassVar[bool] = False
    VALID: ClassVar[list[Valid]] = []
    INVALID: ClassVar[list[Invalid]] = []

    def __init__(self, context: FileContext) -> None:
        super().__init__()
        self.context = context

    def report(self, node: cst.CSTNode, message: str, *, fix: FixSpec | None = None) -> None:
        """Report `node`; the message is one sentence on what grows and why,
        then one on the fix (RULES.md)."""
        self.context.add_report(
            Report(
                rule=type(self),
                node=node,
                message=message,
                fix=fix,
                statement=self.context.tracker.current_statement,
                statement_path=tuple(self.context.tracker.statements),
            )
        )

    @classmethod
    def docs(cls) -> str:
        """The rule's documentation in Markdown, built from its own definition."""
        body = textwrap.dedent(inspect.getdoc(cls) or "").strip()
        header = f"# {cls.name} ({cls.code})\n\n{cls.summary}\n"
        fix_line = {
            None: "Fix: none available.",
            Applicability.SAFE: "Fix: offered where the rewrite is certain; safe (applied by `--fix` and fix-all).",
            Applicability.UNSAFE: (
                "Fix: offered where the rewrite is certain; unsafe (review it: applied only with "
                "`--unsafe-fixes` or chosen by hand, never by fix-all)."
            ),
        }[cls.fix_applicability]
        parts = [header, body, fix_line]
        if cls.INVALID:
            example = textwrap.dedent(cls.INVALID[0].code).strip("\n")
            parts.append("## Flagged\n\n```python\n" + example + "\n```")
            if cls.INVALID[0].expected_fix is not None:
                fixed = textwrap.dedent(cls.INVALID[0].expected_fix).strip("\n")
                parts.append("## After the fix\n\n```python\n" + fixed + "\n```")
        if cls.VALID:
            example = textwrap.dedent(cls.VALID[0].code).strip("\n")
            parts.append("## Not flagged\n\n```python\n" + example + "\n```")
        return "\n\n".join(part for part in parts if part) + "\n"


def deferred_report(
    rule: Rule, node: cst.CSTNode, message: str, fix: FixSpec | None, path: tuple[cst.CSTNode, ...]
) -> Report:
    """A report made after the pass: `path` is the statement path the
    Tracker had where `node` was found, outermost first."""
    return Report(
        rule=type(rule),
        node=node,
        message=message,
        fix=fix,
        statement=path[-1] if path else None,
        statement_path=path,
    )
