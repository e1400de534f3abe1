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


# Fakes shaped like each family's real keys (none is a live credential).
STRIPE_LIVE = "sk_live_" + "51H8xYzAbCdEfGhIjKlMnOpQrStUvWxYz0123456789abcdefghijklmnopqrstuvwx"
JWT = (
    "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9"
    ".eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIn0"
    ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c"
)
AZURE = "AccountKey=" + "A" * 43 + "bcd+/" + "E" * 38 + "=="


@pytest.mark.parametrize(
    ("line", "secret"),
    [
        ('REDIS = "redis://:s3cretpassw0rd@cache:6379/0"', "s3cretpassw0rd"),
        (f'stripe.api_key_live = "{STRIPE_LIVE}"', STRIPE_LIVE),
        ('STRIPE = "sk_test_4eC39HqLyjWDarjtT1zdp7dc"', "sk_test_4eC39HqLyjWDarjtT1zdp7dc"),
        ('maps = Client("AIzaSyA-1234567890abcdefghijklmnopqrstu")', "AIzaSyA-1234567890abcdefghijklmnopqrstu"),
        (f'headers = {{"Authorization": "Bearer {JWT}"}}', JWT),
        (f'conn = "DefaultEndpointsProtocol=https;AccountName=acct;{AZURE};EndpointSuffix=core"', AZURE.split("=", 1)[1]),
        (
            'bus = "Endpoint=sb://x/;SharedAccessKeyName=Root;SharedAccessKey=abcDEF123456ghiJKL789+/="',
            "abcDEF123456ghiJKL789+/=",
        ),
        ('parser.add_argument("--hf-token", type=str, default="my-own-token-value")', "my-own-token-value"),
        ('key = os.getenv("WANDB_API_KEY", "0123456789abcdef0123")', "0123456789abcdef0123"),
        ('token = os.environ.get("HF_TOKEN", "hf-like-but-not-hf-format")', "hf-like-but-not-hf-format"),
        ("# my HF token: abcdefgh1234567890", "abcdefgh1234567890"),
        ("x = 1  # the password is hunter2hunter2", "hunter2hunter2"),
        ('SENDGRID = "SG.abcdefghijklmnopqrstuv.abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG"', None),
        ('TWILIO = "SK0123456789abcdef0123456789abcdef"', None),
        ('discord = "MTIzNDU2Nzg5MDEyMzQ1Njc4.GaBcDe.abcdefghijklmnopqrstuvwxyz0"', None),
        ('gitlab = "glpat-abcdefghijklmnopqrst"', "glpat-abcdefghijklmnopqrst"),
        ('pypi = "pypi-AgEIcHlwaS5vcmc' + "x" * 70 + '"', "pypi-AgEIcHlwaS5vcmc" + "x" * 70),
        ('db_pass = "correct-horse-battery"', "correct-horse-battery"),
    ],
)
def test_each_family_is_redacted(line: str, secret: str | None) -> None:
    redaction = redact(line)
    (value,) = redaction.secrets.values()
    if secret is not None:
        assert value == secret
    assert value not in redaction.text
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
