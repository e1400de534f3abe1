"""Quick fixes, "Ignore OOMxxx for this line" and fix-all, applied the way a
client applies them."""

from __future__ import annotations

import itertools
import textwrap

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from oom_lsp.analysis import Applicability, LintSettings, analyze, registry
from tests.samples import LLAMA_ON_GPU
from tests.server.lsp_session import apply_text_edits, diagnostics_for, edits_of, open_document, replace_text

pytestmark = pytest.mark.asyncio(loop_scope="module")

# A checkpoint of a CUDA model restored without map_location (OOM501).
RESTORE = LLAMA_ON_GPU + 'net.load_state_dict(state["net"])\n'
LOAD = 'import torch\n\nstate = torch.load("ckpt.pt")\n' + RESTORE
_names = itertools.count()


async def _open(client: LanguageClient, text: str, folder: str = "") -> tuple[str, list[types.Diagnostic]]:
    uri = (client.root / folder / f"actions{next(_names)}.py").as_uri()
    since = len(client.published)
    open_document(client, uri, text)
    return uri, await diagnostics_for(client, uri, 1, since)


async def _actions(
    client: LanguageClient, uri: str, diagnostics: list[types.Diagnostic], only: list[str] | None = None
) -> list[types.CodeAction]:
    target = (
        diagnostics[0].range
        if diagnostics
        else types.Range(start=types.Position(line=0, character=0), end=types.Position(line=0, character=0))
    )
    result = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=target,
            context=types.CodeActionContext(diagnostics=diagnostics, only=only),
        )
    )
    return list(result or [])


def _encoding(client: LanguageClient) -> str:
    return client.init_result.capabilities.position_encoding


def _by_title(actions: list[types.CodeAction], title: str) -> types.CodeAction:
    matching = [action for action in actions if action.title == title]
    assert len(matching) == 1, [action.title for action in actions]
    return matching[0]


async def test_quick_fix_is_preferred_and_applies(client: LanguageClient):
    uri, diagnostics = await _open(client, LOAD)
    actions = await _actions(client, uri, diagnostics)
    # Menus draw titles as plain text: the rule's `map_location="cpu"` without its backticks.
    fix = _by_title(actions, 'oom-lsp (OOM501): Pass map_location="cpu"')
    assert not [action.title for action in actions if "`" in action.title]
    assert fix.kind == types.CodeActionKind.QuickFix
    assert fix.is_preferred is True
    assert list(fix.diagnostics) == diagnostics
    fixed = apply_text_edits(LOAD, edits_of(fix, uri), _encoding(client))
    assert fixed == 'import torch\n\nstate = torch.load("ckpt.pt", map_location="cpu")\n' + RESTORE
    if client.capabilities.workspace.workspace_edit.document_changes:
        (change,) = fix.edit.document_changes
        assert change.text_document.version == 1, "edits carry the version they were computed for"


async def test_ignore_for_this_line(client: LanguageClient):
    uri, diagnostics = await _open(client, LOAD)
    action = _by_title(
        await _actions(client, uri, diagnostics), "oom-lsp (OOM501): Ignore OOM501 for this line"
    )
    assert not action.is_preferred
    fixed = apply_text_edits(LOAD, edits_of(action, uri), _encoding(client))
    assert fixed == 'import torch\n\nstate = torch.load("ckpt.pt")  # oom: ignore[OOM501]\n' + RESTORE
    since = len(client.published)
    replace_text(client, uri, 2, fixed)
    assert await diagnostics_for(client, uri, 2, since) == []


async def test_ignore_merges_with_an_existing_comment(client: LanguageClient):
    text = 'import torch\n\nstate = torch.load("ckpt.pt")  # oom: ignore[OOM301] reviewed\n' + RESTORE
    uri, diagnostics = await _open(client, text)
    action = _by_title(
        await _actions(client, uri, diagnostics), "oom-lsp (OOM501): Ignore OOM501 for this line"
    )
    fixed = apply_text_edits(text, edits_of(action, uri), _encoding(client))
    assert (
        fixed
        == 'import torch\n\nstate = torch.load("ckpt.pt")  # oom: ignore[OOM301, OOM501] reviewed\n' + RESTORE
    )


async def test_fix_all_applies_every_safe_fix_as_one_edit(client: LanguageClient):
    both = LLAMA_ON_GPU + 'net.load_state_dict(first["net"])\nnet.load_state_dict(second["net"])\n'
    text = 'import torch\n\nfirst = torch.load("a.pt")\nsecond = torch.load("é.pt")\n' + both
    uri, diagnostics = await _open(client, text)
    assert len(diagnostics) == 2
    (fix_all,) = await _actions(client, uri, [], only=["source.fixAll"])
    assert fix_all.kind == "source.fixAll.oom-lsp"
    edits = edits_of(fix_all, uri)
    assert len(edits) == 1
    fixed = apply_text_edits(text, edits, _encoding(client))
    assert fixed == (
        'import torch\n\nfirst = torch.load("a.pt", map_location="cpu")\n'
        'second = torch.load("é.pt", map_location="cpu")\n' + both
    )
    # Offered in the light-bulb list too, where there is something safe to fix.
    titles = [action.title for action in await _actions(client, uri, diagnostics[:1])]
    assert "oom-lsp: Fix all auto-fixable problems" in titles


async def test_fix_all_in_the_light_bulb_is_resolved_lazily(client: LanguageClient):
    restore = LLAMA_ON_GPU + 'net.load_state_dict(first["net"])\n'
    text = 'import torch\n\nfirst = torch.load("a.pt")\n' + restore
    uri, diagnostics = await _open(client, text)
    assert client.init_result.capabilities.code_action_provider.resolve_provider is True
    fix_all = _by_title(await _actions(client, uri, diagnostics), "oom-lsp: Fix all auto-fixable problems")
    resolve_support = client.capabilities.text_document.code_action.resolve_support
    if resolve_support is not None and "edit" in resolve_support.properties:
        assert fix_all.edit is None, "the whole-file fix waits for codeAction/resolve"
        fix_all = await client.code_action_resolve_async(fix_all)
    fixed = apply_text_edits(text, edits_of(fix_all, uri), _encoding(client))
    assert fixed == 'import torch\n\nfirst = torch.load("a.pt", map_location="cpu")\n' + restore


async def test_resolving_after_an_edit_gives_no_edit(client: LanguageClient):
    uri, diagnostics = await _open(client, LOAD)
    fix_all = _by_title(await _actions(client, uri, diagnostics), "oom-lsp: Fix all auto-fixable problems")
    if fix_all.edit is not None:
        pytest.skip("this client cannot resolve edits: fix-all came with its edit")
    since = len(client.published)
    replace_text(client, uri, 2, "# edited\n" + LOAD)
    await diagnostics_for(client, uri, 2, since)
    resolved = await client.code_action_resolve_async(fix_all)
    assert resolved.edit is None


async def test_fix_all_on_a_clean_file_offers_nothing(client: LanguageClient):
    uri, diagnostics = await _open(client, "import torch\n\nx = torch.zeros(3)\n")
    assert diagnostics == []
    assert await _actions(client, uri, [], only=["source.fixAll.oom-lsp"]) == []


async def test_only_filters_kinds(client: LanguageClient):
    uri, diagnostics = await _open(client, LOAD)
    quick_fixes = await _actions(client, uri, diagnostics, only=["quickfix"])
    assert {action.kind for action in quick_fixes} == {"quickfix"}
    assert await _actions(client, uri, diagnostics, only=["refactor"]) == []


async def test_diagnostics_of_an_older_version_get_no_actions(client: LanguageClient):
    uri, diagnostics = await _open(client, LOAD)
    since = len(client.published)
    shifted = "# a new first line\n" + LOAD
    replace_text(client, uri, 2, shifted)
    await diagnostics_for(client, uri, 2, since)
    assert await _actions(client, uri, diagnostics, only=["quickfix"]) == []


async def test_syntax_errors_get_no_ignore_action(client: LanguageClient):
    uri, diagnostics = await _open(client, "import torch\nx = (\n")
    assert [d.code for d in diagnostics] == ["OOM000"]
    assert await _actions(client, uri, diagnostics) == []


def _fix_examples() -> list[tuple[str, str, str]]:
    """(code, example, expected fix) of each fixable rule's first example that
    has an expected fix and default settings."""
    examples = []
    for code, rule in registry.all_rules().items():
        if rule.notebook_only:
            continue  # notebooks: tests/server/test_notebooks.py
        for example in rule.INVALID:
            if example.expected_fix is not None and not example.settings:
                examples.append((code, textwrap.dedent(example.code), textwrap.dedent(example.expected_fix)))
                break
    return examples


@pytest.mark.parametrize(
    ("code", "example", "expected"), _fix_examples(), ids=[case[0] for case in _fix_examples()]
)
async def test_each_rules_quick_fix(client: LanguageClient, code: str, example: str, expected: str):
    # The example's project is in strict mode: an example need not show the memory at
    # stake to be fixed (its rule's own tests say which level shows it), and selects
    # an opt-in rule.
    folder = f"strict-{code}"
    (client.root / folder).mkdir(exist_ok=True)
    (client.root / folder / "pyproject.toml").write_text(
        f'[tool.oom-lsp]\nstrict = true\nextend-select = ["{code}"]\n'
    )
    uri, diagnostics = await _open(client, example, folder)
    own = [diagnostic for diagnostic in diagnostics if diagnostic.code == code]
    assert own, f"{code} not reported on its own example"
    safe = registry.rule_for(code).fix_applicability is Applicability.SAFE
    actions = await _actions(client, uri, own[:1], only=["quickfix"])
    fixes = [action for action in actions if "Ignore" not in action.title and "Ask AI" not in action.title]
    assert len(fixes) == 1
    assert fixes[0].is_preferred is safe
    fixed = apply_text_edits(example, edits_of(fixes[0], uri), _encoding(client))
    if len(own) == 1 and len(diagnostics) == 1:
        assert fixed == expected
    (fix_all,) = await _actions(client, uri, [], only=["source.fixAll"]) or [None]
    if not safe and fix_all is not None:
        # Fix-all never applies an unsafe fix.
        all_fixed = apply_text_edits(example, edits_of(fix_all, uri), _encoding(client))
        assert code in [
            finding.code for finding in analyze(all_fixed, LintSettings(enabled=frozenset({code}), strict=True))
        ]
