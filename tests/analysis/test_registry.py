from __future__ import annotations

import re

import pytest

from oom_lsp.analysis.registry import (
    META_RULES,
    SelectorError,
    all_rules,
    default_codes,
    expand_selector,
    resolve_selection,
)
from oom_lsp.analysis.rule_store import register

RULES_MD_CODES = [
    "OOM101", "OOM102", "OOM201", "OOM202", "OOM301", "OOM302", "OOM303", "OOM304", "OOM305",
    "OOM401", "OOM402", "OOM501", "OOM502", "OOM503", "OOM601", "OOM602", "OOM603",
    # The notebook family (issue 19): new codes, added after the catalogue's last.
    "OOM701", "OOM702", "OOM703",
]  # fmt: skip


def test_every_rule_of_the_catalogue_is_registered() -> None:
    assert sorted(all_rules()) == RULES_MD_CODES


@pytest.mark.parametrize("code", sorted(all_rules()))
def test_rule_definition_is_complete(code: str) -> None:
    rule = all_rules()[code]
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", rule.name)
    assert rule.summary.strip()
    assert rule.VALID and rule.INVALID, "each rule needs at least one VALID and one INVALID example"
    docs = rule.docs()
    for section in ("## What it does", "## Why is this bad?", "## Example", "## Use instead"):
        assert section in docs, f"{code} docs lack {section}"
    if rule.fix_applicability is not None:
        assert "## Fix safety" in docs
        assert any(example.expected_fix is not None for example in rule.INVALID)


def test_names_are_unique() -> None:
    names = [rule.name for rule in all_rules().values()] + [meta.name for meta in META_RULES.values()]
    assert len(names) == len(set(names))


def test_prefix_selection() -> None:
    assert expand_selector("OOM3") == {"OOM301", "OOM302", "OOM303", "OOM304", "OOM305"}
    assert expand_selector("torch-load-without-map-location") == {"OOM501"}
    assert "OOM900" in expand_selector("ALL")
    assert "OOM900" not in default_codes()
    assert resolve_selection(["OOM5"], ignore=["OOM502"]) == {"OOM501", "OOM503"}
    assert resolve_selection(None, extend_select=["OOM900"]) >= {"OOM900", "OOM501"}
    with pytest.raises(SelectorError):
        expand_selector("E501")
    with pytest.raises(SelectorError):
        expand_selector("OOM77")


def test_catalogue_agrees_with_the_rule_classes() -> None:
    from oom_lsp.analysis.catalogue import CATALOGUE

    defined = {code: (rule.name, rule.default_enabled) for code, rule in all_rules().items()}
    defined |= {code: (meta.name, meta.default_enabled) for code, meta in META_RULES.items()}
    assert {code: (name, enabled) for code, name, enabled in CATALOGUE} == defined


def test_configuration_resolves_without_importing_the_rules() -> None:
    # A run answered from the cache must not pay for libcst's import.
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from oom_lsp.config import parse_config_table\n"
        "from pathlib import Path\n"
        "config = parse_config_table({'select': ['OOM3', 'large-batch-size']}, 'test', Path('.'))\n"
        "config.settings_for(Path('x.py')).fingerprint()\n"
        "print('libcst' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_a_rule_is_registered_once_with_a_valid_code_and_name():

    class BadCode:
        __name__ = "BadCode"
        code, name = "OOM1", "bad-code"

    class BadName:
        __name__ = "BadName"
        code, name = "OOM998", "Bad_Name"

    class Taken:
        __name__ = "Taken"
        code, name = "OOM301", "loss-kept-again"

    all_rules()  # the real rules are registered first
    for rule, problem in ((BadCode, "bad code"), (BadName, "kebab-case"), (Taken, "duplicate rule code")):
        with pytest.raises(ValueError, match=problem):
            register(rule)  # type: ignore[arg-type]
