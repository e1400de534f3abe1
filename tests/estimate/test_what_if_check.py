"""The estimate after a fix finds the what-if's row by the script's text: the text as the what-if
read it (decoded as the checker decodes it), whatever the file's line endings or byte-order mark."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from oom_lsp.cli.estimate import what_if_check
from oom_lsp.estimate.whatif import source_digest
from oom_lsp.cli.what_if import save_record


@pytest.mark.parametrize(
    "raw",
    [b"x = 1\ny = 2\n", b"x = 1\r\ny = 2\r\n", b"\xef\xbb\xbfx = 1\r\ny = 2\r\n"],
    ids=["lf", "crlf", "bom-crlf"],
)
def test_the_fixed_script_is_matched_to_its_row(tmp_path: Path, raw: bytes):
    (tmp_path / "pyproject.toml").write_text("[tool.oom-lsp]\n")
    script = tmp_path / "train.py"
    script.write_bytes(raw)
    # What the what-if digests: the decoded text (run_what_if reads it with decode_source).
    text = raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
    change = {"title": "OOM304 line 2: Drop `retain_graph=True`", "source_digest": source_digest(text)}
    table = {
        "script": str(script),
        "source_digest": source_digest("the text before the fix"),
        "batch_option": None,
        "autocast_option": None,
        "world_size_option": None,
        "changes": [{**change, "needed_bytes": 1000}],
    }
    save_record(tmp_path, table)
    options = SimpleNamespace(batch_size=None, autocast_dtype=None, world_size=None)

    check = what_if_check(script, options, {"peak_bytes": 1010})

    assert check == {
        "change": change["title"],
        "predicted_bytes": 1000,
        "estimated_bytes": 1010,
        "difference_percent": 1.0,
        "agrees": True,
    }
