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

RULES_MD_CODES = [
    "OOM101", "OOM102", "OOM201", "OOM202", "OOM301", "OOM302", "OOM303", "OOM304", "OOM305",
    # Issue 27: GPU tensors (no graph) collected across a data loader; backward(create_graph=True).
    "OOM306", "OOM307", "OOM308",
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
    assert expand_selector("OOM3") == {"OOM301", "OOM302", "OOM303", "OOM304", "OOM305", "OOM306", "OOM307", "OOM308"}
    assert expand_selector("torch-load-without-map-location") == {"OOM501"}
    assert "OOM900" in expand_selector("ALL")
    assert "OOM900" not in default_codes()
    assert resolve_selection(["OOM5"], ignore=["OOM502"]) == {"OOM501", "OOM503"}
    assert resolve_selection(None, extend_select=["OOM900"]) >= {"OOM900", "OOM501"}
    with pytest.raises(SelectorError):
        expand_selector("E501")
    with pytest.raises(SelectorError):
        expand_selector("OOM77")


def test_catalogue_is_generated_from_the_rule_classes() -> None:
    from pathlib import Path

    from oom_lsp.analysis import catalogue
    from oom_lsp.analysis.registry import render_catalogue

    assert Path(catalogue.__file__).read_text(encoding="utf-8") == render_catalogue(), (
        "oom_lsp/analysis/catalogue.py is stale: run python -m oom_lsp.analysis.registry --write-catalogue"
    )


def test_a_rule_is_found_without_being_listed_anywhere(tmp_path, monkeypatch) -> None:
    # The rule class is the one declaration: a module dropped into the package is found.
    import oom_lsp.analysis.rules as package
    from oom_lsp.analysis import registry

    module = tmp_path / "zz_probe_rule.py"
    module.write_text(
        "from oom_lsp.analysis.rule import Rule\n"
        "class Probe(Rule):\n"
        "    code = 'OOM999'\n"
        "    name = 'probe'\n"
        "    summary = 'x'\n"
        "    why = 'x'\n"
        "    remedy = 'x'\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "_RULES", {})
    assert "OOM999" in registry.all_rules()


def test_the_rules_form_no_import_loop_with_the_registry() -> None:
    # Rule modules never import the registry: it finds them, they do not register themselves.
    import ast
    from pathlib import Path

    import oom_lsp.analysis.rules as package

    for path in Path(package.__path__[0]).glob("*.py"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        imported = {
            node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module
        }
        assert "oom_lsp.analysis.registry" not in imported, path.name


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


@pytest.mark.parametrize(
    "code, name, problem",
    [
        ("OOM1", "bad-code", "bad code"),
        ("OOM998", "Bad_Name", "kebab-case"),
        ("OOM301", "loss-kept-again", "duplicate rule code"),  # a rule's code
        ("OOM900", "unused-again", "duplicate rule code"),  # a meta code (not a visitor)
    ],
)
def test_a_found_rule_has_a_valid_code_and_name_used_once(tmp_path, monkeypatch, code, name, problem) -> None:
    # The registration's checks run on the rules the registry finds, before any is used.
    import oom_lsp.analysis.rules as package
    from oom_lsp.analysis import registry

    # A module name of its own: the package's modules stay imported (sys.modules) between tests.
    (tmp_path / f"zz_checked_{problem.split()[0]}_{code.lower()}.py").write_text(
        "from oom_lsp.analysis.rule import Rule\n"
        "class Probe(Rule):\n"
        f"    code = {code!r}\n"
        f"    name = {name!r}\n"
        "    summary = 'x'\n"
        "    why = 'x'\n"
        "    remedy = 'x'\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(package, "__path__", [*package.__path__, str(tmp_path)])
    monkeypatch.setattr(registry, "_RULES", {})
    with pytest.raises(ValueError, match=problem):
        registry.all_rules()


@pytest.mark.parametrize("code", sorted(code for code, rule in all_rules().items() if rule.needs_any_of))
def test_every_invalid_example_contains_a_word_its_rule_needs(code: str) -> None:
    # The engine skips the rule on text without any of these words: an example
    # the rule flags without one would be a finding the gate loses.
    rule = all_rules()[code]
    for example in rule.INVALID:
        assert any(word in example.code for word in rule.needs_any_of), example.code


def test_a_rule_runs_only_on_text_that_contains_a_word_it_needs(monkeypatch) -> None:
    from oom_lsp.analysis.engine import analyze
    from oom_lsp.analysis.settings import default_settings

    rule = all_rules()["OOM402"]
    built: list[object] = []
    original = rule.__init__

    def counting_init(self, context) -> None:  # type: ignore[no-untyped-def]
        built.append(self)
        original(self, context)

    monkeypatch.setattr(rule, "__init__", counting_init)
    plain = "import torch\nscores = q @ k.transpose(-2, -1)\n"
    assert analyze(plain, default_settings(), "a.py") == []
    assert built == []
    attention = "import torch\nattn = torch.softmax(q @ k.transpose(-2, -1), dim=-1) @ v\n"
    codes = [finding.code for finding in analyze(attention, default_settings(), "a.py")]
    assert len(built) == 1 and codes == ["OOM402"]
