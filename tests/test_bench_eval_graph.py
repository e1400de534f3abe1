"""bench/eval_graph_peak.py measures the fact OOM303's default level rests on:
an evaluation with autograd on that keeps its output into the next iteration
needs more than the training step; one freed within the iteration does not."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("torch")

_PATH = Path(__file__).resolve().parents[1] / "bench" / "eval_graph_peak.py"


def _bench():
    spec = importlib.util.spec_from_file_location("eval_graph_peak", _PATH)
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


def test_a_graph_kept_into_the_next_batch_needs_more_than_training() -> None:
    bench = _bench()
    sizes = {"batch": 8, "size": 32, "blocks": 4}  # activations outweigh the optimizer step's temporaries
    train = bench.peak_bytes("train", **sizes)
    kept = bench.peak_bytes("eval_kept", **sizes)
    inline = bench.peak_bytes("eval_inline", **sizes)
    inference = bench.peak_bytes("eval_inference_mode", **sizes)
    assert kept > 1.3 * train  # two batches' activations alive at once
    assert inline <= train  # one batch's, freed within the statement
    assert inference < inline / 2  # no activations kept at all
