"""`path:line:col: CODE [*] message`, one line per finding (Ruff's concise)."""

from __future__ import annotations

from collections.abc import Sequence

from oom_lsp.output import CheckedFile, RenderOptions, applicable_fix, located


def render(files: Sequence[CheckedFile], options: RenderOptions) -> str:
    lines = []
    for file, finding in located(files):
        fix = applicable_fix(finding, options)
        marker = " [*]" if fix is not None else ""
        lines.append(
            f"{file.display}:{finding.line}:{finding.column + 1}: {finding.code}{marker} {finding.message}"
        )
        if options.show_fix_titles and finding.fix is not None:
            lines.append(f"    help: {finding.fix.title} ({finding.fix.applicability.value} fix)")
    return "".join(line + "\n" for line in lines)
