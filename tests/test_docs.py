"""docs/rules.md is what `oom-lsp rule --all` prints: the docs cannot drift from the rules."""

from __future__ import annotations

from pathlib import Path

import pytest

from oom_lsp import cli

ROOT = Path(__file__).resolve().parents[1]


def test_rules_md_is_generated_from_the_rules(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["rule", "--all"]) == 0
    generated = capsys.readouterr().out
    documented = (ROOT / "docs" / "rules.md").read_text(encoding="utf-8")
    assert documented.endswith(generated), "regenerate docs/rules.md with `oom-lsp rule --all`"


def _markdown_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_docs_point_at_nothing_outside_the_repository() -> None:
    import re

    outside = []
    for path in _markdown_files():
        text = path.read_text(encoding="utf-8")
        for target in re.findall(r"\]\(([^)#\s]+)[^)]*\)|`(\.\./[^`\s]+)`", text):
            link = next(part for part in target if part)
            if "://" in link:
                continue
            if not (path.parent / link).resolve().is_relative_to(ROOT):
                outside.append(f"{path.relative_to(ROOT)}: {link}")
    assert outside == []


def test_the_readme_table_is_the_whole_catalogue_of_codes() -> None:
    from oom_lsp.analysis import registry

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    codes = {*registry.all_rules(), *registry.META_RULES}
    assert sorted(code for code in codes if code not in readme) == []
    assert "a code never changes meaning" in readme


def test_the_exit_code_table_covers_every_command() -> None:
    table = (ROOT / "docs" / "exit-codes.md").read_text(encoding="utf-8")
    commands = [*cli.BUILTIN_COMMANDS]
    parser = cli.build_parser()
    subparsers = next(action for action in parser._actions if action.dest == "command")
    commands += list(subparsers.choices)
    missing = [name for name in commands if f"`oom-lsp {name}" not in table and f"oom-lsp {name}`" not in table]
    assert missing == []


def test_a_rule_page_shows_each_example_once() -> None:
    """"Not flagged" is a valid example the page does not already show as "Use instead" or as the
    fixed example."""
    import re

    from oom_lsp.analysis.registry import all_rules

    for code, rule in all_rules().items():
        blocks = [block.strip() for block in re.findall(r"```python\n(.*?)```", rule.docs(), re.DOTALL)]
        assert len(blocks) == len(set(blocks)), f"{code} shows an example twice"
