from __future__ import annotations

import pytest

from oom_lsp.llm.edits import EditRefused, Region, SearchReplace, apply_blocks
from oom_lsp.llm.secrets import redact, restore


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        ('OPENAI = "sk-proj-abcdefghijklmnopqrstuvwxyz"', "sk-proj-abcdefghijklmnopqrstuvwxyz"),
        ('login("hf_abcdefghijklmnopqrstuvwxyz0")', "hf_abcdefghijklmnopqrstuvwxyz0"),
        ('repo = "ghp_abcdefghijklmnopqrstuvwxyz0123"', "ghp_abcdefghijklmnopqrstuvwxyz0123"),
        ('aws = "AKIAABCDEFGHIJKLMNOP"', "AKIAABCDEFGHIJKLMNOP"),
        ('slack = "xoxb-1234567890-abcdef"', "xoxb-1234567890-abcdef"),
        ('db = "postgres://bob:hunter2secret@db:5432/x"', "hunter2secret"),
        ('api_key = "abcdefgh12345"', "abcdefgh12345"),
        ('wandb.login(key="0123456789abcdef")', "0123456789abcdef"),
        ('cfg = {"hfToken": "abcdefghijklmnop"}', "abcdefghijklmnop"),
        ('password: str = "correct horse"', "correct horse"),
        ('os.environ["WANDB_API_KEY"] = "abcdefghijk"', "abcdefghijk"),
        ("SECRET_KEY = 'abcdefghijk'", "abcdefghijk"),
    ],
)
def test_redacted_and_restored(line: str, secret: str) -> None:
    redaction = redact(line)
    assert secret not in redaction.text and "__REDACTED_1__" in redaction.text
    assert redaction.secrets == {"__REDACTED_1__": secret}
    assert redaction.restore(redaction.text) == line


@pytest.mark.parametrize(
    "line",
    [
        'tokenizer = "bert-base-uncased-long"',  # a name that merely contains "token"
        'password = "short"',  # under 8 characters
        "api_key = os.environ['OPENAI_API_KEY']",  # not a literal
        'monkey = "abcdefghijklmnop"',  # "key" inside another word
        "batch_size = 32",
    ],
)
def test_left_alone(line: str) -> None:
    assert redact(line).text == line


def test_pem_block_and_numbering() -> None:
    text = (
        'KEY = """-----BEGIN RSA PRIVATE KEY-----\nMIIEabc\n-----END RSA PRIVATE KEY-----"""\n'
        'a_token = "same-value-123"\nb_token = "same-value-123"\n'
    )
    redaction = redact(text)
    assert "MIIEabc" not in redaction.text
    assert redaction.text.count("__REDACTED_2__") == 2  # one value, one placeholder
    assert redaction.restore(redaction.text) == text


def test_restore_leaves_unknown_placeholders() -> None:
    assert restore("x = '__REDACTED_9__'", {"__REDACTED_1__": "a"}) == "x = '__REDACTED_9__'"


def test_an_edit_touching_a_redacted_line_keeps_the_real_value() -> None:
    text = 'def train():\n    wandb.login(key="0123456789abcdef")\n    run()\n'
    secrets = redact(text).secrets
    block = SearchReplace(
        '    wandb.login(key="__REDACTED_1__")\n    run()\n',
        '    wandb.login(key="__REDACTED_1__")\n    with torch.no_grad():\n        run()\n',
    )
    result = apply_blocks(text, [block], Region(1, 3), secrets)
    assert (
        result.new_text
        == 'def train():\n    wandb.login(key="0123456789abcdef")\n    with torch.no_grad():\n        run()\n'
    )


def test_an_edit_cannot_introduce_a_placeholder() -> None:
    text = "def train():\n    run()\n"
    with pytest.raises(EditRefused, match="placeholder __REDACTED_3__"):
        apply_blocks(text, [SearchReplace("    run()\n", '    key = "__REDACTED_3__"\n')], Region(1, 2), {})
