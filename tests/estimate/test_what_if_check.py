"""The estimate after a fix finds the what-if's row by the script's text: the text as the what-if
read it (decoded as the checker decodes it), whatever the file's line endings or byte-order mark."""

from __future__ import annotations

from pathlib import Path

import pytest

from oom_lsp.estimate.estimator import EstimateOptions
from oom_lsp.estimate.results import EstimateResult, WhatIfCheck
from oom_lsp.estimate.whatif_record import save_record, source_digest
from oom_lsp.usecases.estimate import EstimateRequest, what_if_check
from tests.estimate.factories import prediction, what_if_row, what_if_table


@pytest.mark.parametrize(
    "raw",
    [b"x = 1\ny = 2\n", b"x = 1\r\ny = 2\r\n", b"\xef\xbb\xbfx = 1\r\ny = 2\r\n"],
    ids=["lf", "crlf", "bom-crlf"],
)
def test_the_fixed_script_is_matched_to_its_row(tmp_path: Path, raw: bytes):
    (tmp_path / "pyproject.toml").write_text("[tool.oom-lsp]\n")
    script = tmp_path / "train.py"
    script.write_bytes(raw)
    # What the what-if digests: the decoded text (the use case reads it with decode_source).
    text = raw.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
    title = "OOM304 line 2: Drop `retain_graph=True`"
    row = what_if_row("fix:OOM304:2:1", title, 1000, source_digest=source_digest(text))
    save_record(
        tmp_path, what_if_table(str(script), [row], source_digest=source_digest("the text before the fix"))
    )

    check = what_if_check(
        EstimateRequest(script=script, root=tmp_path),
        EstimateOptions(script=script),
        EstimateResult(prediction(peak_bytes=1010)),
    )

    assert check == WhatIfCheck(title, 1000, 1010, 1.0, True)
