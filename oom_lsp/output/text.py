"""`path:line:col: CODE [*] message`, one line per finding (Ruff's concise);
`nb.ipynb:cell 4:3:5: ...` in a notebook."""

from __future__ import annotations

from collections.abc import Sequence

from oom_lsp.output.base import CheckedFile, RenderOptions, applicable_fix, located, location, printable


def render(files: Sequence[CheckedFile], options: RenderOptions) -> str:
    lines = []
    for file, finding in located(files):
        fix = applicable_fix(finding, options)
        marker = " [*]" if fix is not None else ""
        lines.append(f"{file.display}:{location(finding)}: {finding.code}{marker} {finding.message}")
        if options.show_fix_titles and finding.fix is not None:
            lines.append(f"    {finding.fix.help} ({finding.fix.applicability.value} fix)")
    return "".join(printable(line) + "\n" for line in lines)
