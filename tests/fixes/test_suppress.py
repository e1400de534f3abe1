"""The "Ignore OOMxxx for this line" edit: placement, merging, and that the
result really silences the finding."""

from __future__ import annotations

from dataclasses import replace

import pytest

from oom_lsp.analysis import analyze, default_settings
from oom_lsp.edits import apply_edits
from oom_lsp.fixes.suppress import ignore_for_line

LOAD = 'import torch\nstate = torch.load("ckpt.pt")\n'


def _ignored(source: str, line: int, code: str = "OOM501", statement_line: int | None = None) -> str:
    edit = ignore_for_line(source, line, code, statement_line)
    assert edit is not None
    return apply_edits(source, [edit])


def _codes(source: str) -> list[str]:
    # Strict mode: a checkpoint of an unsized model is reported there only.
    return [finding.code for finding in analyze(source, replace(default_settings(), strict=True))]


def test_appends_a_trailing_comment():
    source = LOAD + "model.cuda().load_state_dict(state)\n"
    fixed = _ignored(source, 2)
    assert fixed == (
        'import torch\nstate = torch.load("ckpt.pt")  # oom: ignore[OOM501]\n'
        "model.cuda().load_state_dict(state)\n"
    )
    assert _codes(source) == ["OOM501"]
    assert _codes(fixed) == []


def test_replaces_trailing_whitespace():
    source = 'import torch\nstate = torch.load("ckpt.pt")   \n'
    assert _ignored(source, 2) == 'import torch\nstate = torch.load("ckpt.pt")  # oom: ignore[OOM501]\n'


@pytest.mark.parametrize(
    ("comment", "expected"),
    [
        ("# oom: ignore[OOM301]", "# oom: ignore[OOM301, OOM501]"),
        ("# oom: ignore[OOM301, OOM302]", "# oom: ignore[OOM301, OOM302, OOM501]"),
        ("# oom: ignore[OOM301 ] why", "# oom: ignore[OOM301, OOM501 ] why"),
        ("#oom:ignore[]", "#oom:ignore[OOM501]"),
        ("# noqa: E501  # oom: ignore[OOM301]", "# noqa: E501  # oom: ignore[OOM301, OOM501]"),
    ],
)
def test_merges_with_an_existing_ignore(comment: str, expected: str):
    source = f'import torch\nstate = torch.load("ckpt.pt")  {comment}\n'
    fixed = _ignored(source, 2)
    assert fixed == f'import torch\nstate = torch.load("ckpt.pt")  {expected}\n'
    assert _codes(fixed) == []


def test_already_ignored_gives_no_edit():
    source = 'import torch\nstate = torch.load("ckpt.pt")  # oom: ignore[oom501]\n'
    assert ignore_for_line(source, 2, "OOM501") is None


def test_keeps_another_comment_and_appends_after_it():
    source = 'import torch\nstate = torch.load("ckpt.pt")  # noqa: E501\n'
    fixed = _ignored(source, 2)
    assert fixed == 'import torch\nstate = torch.load("ckpt.pt")  # noqa: E501  # oom: ignore[OOM501]\n'
    assert _codes(fixed) == []


def test_does_not_merge_into_a_file_level_ignore():
    source = 'import torch\nstate = torch.load("ckpt.pt")  # oom: ignore-file[OOM301]\n'
    fixed = _ignored(source, 2)
    assert fixed.endswith("# oom: ignore-file[OOM301]  # oom: ignore[OOM501]\n")


def test_line_ending_inside_a_string_gets_an_own_line_comment():
    source = 'import torch\ndef f():\n    state = torch.load("""a\nb""")\n'
    fixed = _ignored(source, 3, statement_line=3)
    assert fixed == 'import torch\ndef f():\n    # oom: ignore[OOM501]\n    state = torch.load("""a\nb""")\n'
    assert _codes(fixed) == []


def test_backslash_continuation_gets_an_own_line_comment():
    source = 'import torch\nstate = \\\n    torch.load("ckpt.pt")\n'
    fixed = _ignored(source, 2, statement_line=2)
    assert fixed == 'import torch\n# oom: ignore[OOM501]\nstate = \\\n    torch.load("ckpt.pt")\n'


def test_own_line_comment_above_is_extended():
    source = 'import torch\n# oom: ignore[OOM301]\nstate = torch.load("""a\nb""")\n'
    fixed = _ignored(source, 3, statement_line=3)
    assert fixed == 'import torch\n# oom: ignore[OOM301, OOM501]\nstate = torch.load("""a\nb""")\n'


def test_keeps_crlf_newlines():
    source = 'import torch\r\nstate = torch.load("""a\r\nb""")\r\n'
    fixed = _ignored(source, 2, statement_line=2)
    assert fixed == 'import torch\r\n# oom: ignore[OOM501]\r\nstate = torch.load("""a\r\nb""")\r\n'


def test_columns_are_code_points():
    source = 'import torch\nstate = torch.load("é😀.pt")\n'
    assert _ignored(source, 2) == 'import torch\nstate = torch.load("é😀.pt")  # oom: ignore[OOM501]\n'


def test_out_of_range_line_and_untokenizable_file():
    assert ignore_for_line(LOAD, 7, "OOM501") is None
    assert ignore_for_line('x = """never closed\n', 1, "OOM501") is None


def test_a_suppression_of_a_finding_shown_only_in_strict_mode_is_used_at_both_levels():
    # The checkpoint of an unsized model is a strict-mode finding: the comment a strict
    # user wrote for it is no "unused suppression" for a teammate (or CI) at the default level.
    source = _ignored(LOAD + "model.cuda().load_state_dict(state)\n", 2)
    for strict in (False, True):
        settings = replace(default_settings(), strict=strict)
        with_unused = replace(settings, enabled=settings.enabled | {"OOM900"})
        assert [finding.code for finding in analyze(source, with_unused)] == []
    # A comment that suppresses nothing at either level is still reported.
    stale = 'import torch\nx = torch.zeros(3)  # oom: ignore[OOM501]\n'
    settings = replace(default_settings(), enabled=default_settings().enabled | {"OOM900"})
    assert [finding.code for finding in analyze(stale, settings)] == ["OOM900"]
