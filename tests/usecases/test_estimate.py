"""The estimate use case directly, without a face: the target resolved from the same sources in
the same order for every face, and the comparison with a what-if's prediction (which the editor
makes after a search too, like with like: the plain estimate)."""

from __future__ import annotations

from pathlib import Path

import pytest

from oom_lsp.config import parse_config_table
from oom_lsp.estimate.gpus import GIB
from oom_lsp.estimate.results import EstimateResult
from oom_lsp.estimate.whatif_record import save_record, source_digest
from oom_lsp.usecases.estimate import EstimateInputError, EstimateRequest, resolve_target, run_estimate
from tests.estimate.factories import what_if_row, what_if_table
from tests.server.lsp_session import TRAINING_SCRIPT


def _config(tmp_path: Path, **table: object):
    return parse_config_table(table, "pyproject.toml", tmp_path)


def test_the_target_comes_from_the_same_sources_in_the_same_order(tmp_path: Path) -> None:
    config = _config(tmp_path, **{"gpu-memory": "12GiB", "gpus": {"Lab card": "40GiB"}})
    # A GPU named, then a memory, then the editor's setting, then the project's gpu-memory.
    assert resolve_target(config, "RTX 3090", None, "T4").name == "GeForce RTX 3090"
    assert resolve_target(config, None, "20GiB", "T4").memory == 20 * GIB
    assert resolve_target(config, None, None, "T4").name == "T4"
    assert resolve_target(config, None, None, None).memory == 12 * GIB
    assert resolve_target(config, "lab card").memory == 40 * GIB  # the project's own table
    assert resolve_target(_config(tmp_path)) is None
    with pytest.raises(EstimateInputError, match="unknown GPU"):
        resolve_target(config, "RTX 9999")


def test_a_search_compares_the_plain_estimate_with_the_what_ifs_prediction(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(TRAINING_SCRIPT, encoding="utf-8")
    plain = EstimateRequest(script=script, device="cpu", root=tmp_path)
    first = run_estimate(plain)
    assert isinstance(first, EstimateResult)
    # No what-if predicted this text: the plain estimate says so (null), a search says nothing.
    assert first.to_json()["what_if_check"] is None
    searched = EstimateRequest(script=script, device="cpu", root=tmp_path, find_max_batch=True)
    searched.gpu = resolve_target(_config(tmp_path), gpu_memory="1GiB")
    assert "what_if_check" not in run_estimate(searched).to_json()

    # A what-if predicted this very text (a fix applied) at what the plain estimate needs.
    needed = first.prediction.needed_bytes
    row = what_if_row(
        "fix:OOM301:1:1",
        "OOM301 line 1: Accumulate `.item()`",
        needed,
        0,
        source_digest=source_digest(TRAINING_SCRIPT),
    )
    save_record(tmp_path, what_if_table(str(script), [row], source_digest="the text before"))

    result = run_estimate(searched)

    assert result.max_batch is not None and result.max_batch.max_batch
    check = result.what_if_check
    assert check is not None and check.estimated_bytes == needed and check.agrees
    assert check.difference_percent == 0.0
    assert result.to_json()["what_if_check"]["change"] == "OOM301 line 1: Accumulate `.item()`"
