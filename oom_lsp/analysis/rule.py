"""What a rule is: a batched libcst visitor that carries its own docs and tests.

A rule subclasses `Rule`, sets its class attributes (code, kebab-case name, a
one-line summary, one or two sentences of why and the remedy for the editor's
hover, its default severity, whether and how safely it fixes) and lists
`VALID` and `INVALID` examples. The examples are its unit tests
(`tests/analysis/test_rule_examples.py` generates them) and its documentation
(`oom-lsp rule CODE`, hover in the editor). Its docstring has the sections of
Ruff's rule docs: "What it does", "Why is this bad?" (what grows in memory),
"Example", "Use instead", and "Fix safety" when it fixes.

A finding's message says what is wrong in one short sentence (under 120
characters, plain text: editors show it without Markdown and cut it near 100);
the fix is the code action's title, the why is in the hover and the docs.

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
    # Reported at the default level too (not only in strict mode); None: as
    # the rule's findings are by default (an advisory rule's are not, unless
    # the example shows the memory at stake).
    by_default: bool | None = None

    def shown_by_default(self, rule: type[Rule]) -> bool:
        return self.by_default if self.by_default is not None else not rule.advisory


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
    # This finding's severity when it differs from the rule's default (what is
    # at stake differs: a leak of host memory vs one of GPU activations).
    severity: Severity | None = None
    # Whether the facts show that the memory at stake matters (a size, a
    # growth with the length of the run); None: the rule's default (an
    # advisory rule's findings are unproven unless it says otherwise).
    # Unproven findings are shown only in strict mode.
    proven: bool | None = None

    @property
    def shown_by_default(self) -> bool:
        return self.proven if self.proven is not None else not self.rule.advisory


MESSAGE_LIMIT = 120
_SHOWN_CODE_LIMIT = 32


def short_code(code: str, limit: int = _SHOWN_CODE_LIMIT) -> str:
    """Source code quoted in a message: its first line, cut to `limit` characters."""
    first = code.strip().split("\n", 1)[0]
    if len(first) <= limit and first == code.strip():
        return first
    return first[: limit - 3].rstrip() + "..."


class Rule(cst.BatchableCSTVisitor):
    code: ClassVar[str]
    name: ClassVar[str]
    summary: ClassVar[str]
    # The hover's short version of the docs: why it costs memory (one or two
    # sentences) and what to do instead where no quick fix applies (one line).
    why: ClassVar[str]
    remedy: ClassVar[str]
    default_severity: ClassVar[Severity] = Severity.WARNING
    # None: the rule never fixes. Otherwise the safety of its fix.
    fix_applicability: ClassVar[Applicability | None] = None
    # Rules off unless selected explicitly (a prefix or ALL selects them too).
    default_enabled: ClassVar[bool] = True
    # Runs on a notebook's cells only (oom_lsp.notebooks); its examples are notebooks
    # in the percent format (`# %%` starts a cell).
    notebook_only: ClassVar[bool] = False
    # Advice whose worth depends on sizes (mixed precision, float64, a checkpoint's
    # device...): a finding is shown by default only where the size facts show
    # that the memory at stake matters (`report(..., proven=True)`), else in
    # strict mode only.
    advisory: ClassVar[bool] = False
    # Words every finding of the rule needs in the file's text (a name it must
    # call, import or read), case-sensitive: a file that contains none of them
    # cannot have a finding, so the rule is not run on it. Empty: always run.
    needs_any_of: ClassVar[tuple[str, ...]] = ()
    VALID: ClassVar[list[Valid]] = []
    INVALID: ClassVar[list[Invalid]] = []

    def __init__(self, context: FileContext) -> None:
        super().__init__()
        self.context = context

    def report(
        self,
        node: cst.CSTNode,
        message: str,
        *,
        fix: FixSpec | None = None,
        severity: Severity | None = None,
        proven: bool | None = None,
    ) -> None:
        """Report `node`; the message is one short plain-text sentence on what
        is wrong (the fix is in the fix's title, the why in `why`)."""
        self.context.add_report(
            Report(
                rule=type(self),
                node=node,
                message=message,
                fix=fix,
                statement=self.context.tracker.current_statement,
                statement_path=tuple(self.context.tracker.statements),
                severity=severity,
                proven=proven,
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
        level_line = (
            "Level: advisory. A finding is shown by default where the size facts show the memory at stake "
            "(the message then says how much); elsewhere only in strict mode (`--strict`, `strict = true`)."
            if cls.advisory
            else ""
        )
        parts = [header, body, fix_line, level_line]
        if cls.INVALID:
            example = textwrap.dedent(cls.INVALID[0].code).strip("\n")
            parts.append("## Flagged\n\n```python\n" + example + "\n```")
            if cls.INVALID[0].expected_fix is not None:
                fixed = textwrap.dedent(cls.INVALID[0].expected_fix).strip("\n")
                parts.append("## After the fix\n\n```python\n" + fixed + "\n```")
        # The first valid example that the page does not already show (the
        # docstring's "Use instead" or the fixed example is often VALID[0] itself).
        shown = _code_blocks(body)
        if cls.INVALID and cls.INVALID[0].expected_fix is not None:
            shown.add(textwrap.dedent(cls.INVALID[0].expected_fix).strip())
        for valid in cls.VALID:
            example = textwrap.dedent(valid.code).strip("\n")
            if example.strip() not in shown:
                parts.append("## Not flagged\n\n```python\n" + example + "\n```")
                break
        return "\n\n".join(part for part in parts if part) + "\n"


def _code_blocks(markdown: str) -> set[str]:
    """The contents of the fenced code blocks of a docstring, stripped."""
    blocks, current = set(), None
    for line in markdown.splitlines():
        if line.startswith("```"):
            if current is None:
                current = []
            else:
                blocks.add(textwrap.dedent("\n".join(current)).strip())
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def deferred_report(
    rule: Rule,
    node: cst.CSTNode,
    message: str,
    fix: FixSpec | None,
    path: tuple[cst.CSTNode, ...],
    *,
    severity: Severity | None = None,
    proven: bool | None = None,
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
        severity=severity,
        proven=proven,
    )
