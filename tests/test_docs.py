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
