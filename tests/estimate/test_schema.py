"""The JSON of `oom-lsp estimate --format json` is a public interface: its keys never change.

tests/estimate/samples/ holds the JSON the CLI of main printed for each kind of estimate (one
world size on CUDA and on the CPU, the largest batch found and none found, the fallback to real
CPU steps, a rank of DDP, a sweep of world sizes, the worst case of the data, a notebook, the
what-if), the project's paths replaced by /project/: the what-if's from before the results were
typed, the estimates' from main's untyped code after issue 31 (`verdict_basis`, the CUDA context
by release). The typed results
(oom_lsp.estimate.results) must read each back and write it out again to the byte, and every
key they write must be one of SCHEMA below: a key renamed in `to_json` or in `from_json` fails
here. A real estimate checks the same of what the CLI prints now (test_estimate.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oom_lsp.estimate.results import EstimateResult, Sweep, WhatIfTable

SAMPLES = Path(__file__).parent / "samples"
# Dicts whose keys are data (categories, tensor paths), not part of the schema.
_MAPS = {"breakdown", "shapes", "quantized_layers", "environment"}


def key_paths(value: Any, path: str = "$") -> set[str]:
    """Every key's path in a JSON value: `$.max_batch.verified.peak_at.op`; a list's items as
    `[]`, a map's keys (the breakdown's categories) as `*`."""
    found: set[str] = set()
    if isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.*" if path.rpartition(".")[2] in _MAPS else f"{path}.{key}"
            found.add(here)
            found |= key_paths(item, here)
    elif isinstance(value, list):
        for item in value:
            found |= key_paths(item, f"{path}[]")
    return found


def _prediction(prefix: str) -> set[str]:
    """The keys of one prediction under `prefix`."""
    keys = {
        "script",
        "args",
        "device",
        "batch_size",
        "peak_bytes",
        "breakdown",
        "breakdown.*",
        "reserved_bytes",
        "context_bytes",
        "process_bytes",
        "peak_at",
        "peak_at.op",
        "peak_at.module",
        "peak_at.phase",
        "peak_at.file",
        "peak_at.line",
        "peak_at.cell",
        "top_modules",
        "top_lines",
        "gpu",
        "gpu.name",
        "gpu.memory",
        "verdict",
        "corrections",
        "corrections[].name",
        "corrections[].detail",
        "corrections[].bytes",
        "steps_traced",
        "seconds",
        "method",
        "torch",
        "batch_knobs",
        "batch_knobs[].kind",
        "batch_knobs[].file",
        "batch_knobs[].line",
        "batch_knobs[].cell",
        "data_spread",
        "data_spread.seeds",
        "data_spread.peak_bytes",
        "peak_batch",
        "peak_batch.step",
        "peak_batch.micro_batch",
        "peak_batch.index",
        "peak_batch.shapes",
        "peak_batch.shapes.*",
        "peak_batch.loader",
        "peak_batch.loader.file",
        "peak_batch.loader.line",
        "peak_batch.loader.cell",
        "peak_batch.worst",
        "batches_traced",
        "distributed",
        "distributed.world_size",
        "distributed.nproc_per_node",
        "distributed.rank",
        "distributed.backend",
        "distributed.engines",
        "distributed.ddp",
        "distributed.ddp[].line",
        "distributed.ddp[].bucket_cap_mb",
        "distributed.ddp[].find_unused_parameters",
        "distributed.ddp[].gradient_as_bucket_view",
        "distributed.ddp[].static_graph",
        "distributed.ddp[].broadcast_buffers",
        "distributed.ddp[].hook",
        "distributed.ddp[].rebuilt_at_step",
        "distributed.fsdp_units",
        "distributed.device_meshes",
        "distributed.process_groups",
        "worst_case",
        "worst_case.peak_bytes",
        "worst_case.reserved_bytes",
        "worst_case.context_bytes",
        "worst_case.process_bytes",
        "worst_case.verdict",
        "worst_case.peak_at",
        "worst_case.peak_at.op",
        "worst_case.peak_at.module",
        "worst_case.peak_at.phase",
        "worst_case.peak_at.file",
        "worst_case.peak_at.line",
        "worst_case.batches",
        "worst_case.batches[].loader",
        "worst_case.batches[].loader.file",
        "worst_case.batches[].loader.line",
        "worst_case.batches[].shapes",
        "worst_case.batches[].shapes.*",
        "worst_case.batches[].samples",
        "worst_case.batches[].scanned",
        "worst_case.batches[].batch_size",
        "worst_case.batches[].drop_last",
        "breakdown_batch_size",
        "fallback",
        "fallback.reason",
        "fallback.uncertainty",
        "verdict_basis",
        "verdict_basis.figure",
        "verdict_basis.bytes",
        "verdict_basis.capacity_bytes",
        "verdict_basis.allocated_bytes",
    }
    return {f"{prefix}.{key}" for key in keys}


def _search(prefix: str) -> set[str]:
    keys = {
        "fit",
        "fit.intercept_bytes",
        "fit.bytes_per_sample",
        "fit.batch_sizes",
        "margin",
        "budget_bytes",
        "limit",
        "script_batch_size",
        "gradient_accumulation",
        "gradient_accumulation.micro_batch",
        "gradient_accumulation.steps",
        "gradient_accumulation.effective_batch",
        "line_max_batch",
        "search_limit",
        "max_batch",
        "reason",
        "verified",
        "bound",
        "next_checked",
        "checks",
        "explanation",
    }
    return {f"{prefix}.{key}" for key in keys} | _prediction(f"{prefix}.verified")


ESTIMATE_SCHEMA = (
    _prediction("$")
    | {"$.max_batch", "$.what_if_check"}
    | _search("$.max_batch")
    | {
        f"$.what_if_check.{key}"
        for key in ("change", "predicted_bytes", "estimated_bytes", "difference_percent", "agrees")
    }
    | {
        "$.notebook",
        "$.notebook.cells_run",
        "$.notebook.not_run",
        "$.notebook.not_run[].cell",
        "$.notebook.not_run[].line",
        "$.notebook.not_run[].code",
    }
)
SWEEP_SCHEMA = (
    {
        "$.world_sizes",
        "$.fewest_gpus",
        "$.runs",
        "$.runs[].world_size",
        "$.runs[].estimate",
        "$.runs[].max_batch",
    }
    | _prediction("$.runs[].estimate")
    | {"$.runs[].estimate.max_batch"}
    | _search("$.runs[].estimate.max_batch")
    | _search("$.runs[].max_batch")
)
_ROW = {
    "key",
    "title",
    "how",
    "safety",
    "code",
    "line",
    "source_digest",
    "autocast_dtype",
    "batch_size",
    "error",
    "growth_per_step",
    "stops_growth",
    "fallback",
    "needed_bytes",
    "peak_bytes",
    "saving_bytes",
    "saving_percent",
    "verdict",
    "fits",
}
WHAT_IF_SCHEMA = (
    {
        f"$.{key}"
        for key in (
            "script",
            "device",
            "gpu",
            "gpu_memory",
            "batch_size",
            "source_digest",
            "batch_option",
            "autocast_option",
            "world_size_option",
            "baseline",
            "changes",
            "not_applicable",
        )
    }
    | {
        f"$.baseline.{key}"
        for key in ("needed_bytes", "peak_bytes", "verdict", "fits", "growth_per_step", "steps_to_oom")
    }
    | {f"$.changes[].{key}" for key in _ROW}
    | {"$.not_applicable[].title", "$.not_applicable[].why"}
)
ESTIMATES = [
    "estimate_cuda",
    "estimate_cpu",
    "search",
    "search_none_fits",
    "fallback",
    "distributed",
    "worst_case",
    "notebook",
]


def _sample(name: str) -> dict[str, Any]:
    return json.loads((SAMPLES / f"{name}.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("name", ESTIMATES)
def test_an_estimate_is_read_and_written_back_to_the_byte(name: str) -> None:
    sample = _sample(name)
    written = EstimateResult.from_json(sample).to_json()
    assert json.dumps(written, indent=2) == json.dumps(sample, indent=2)
    assert key_paths(written) <= ESTIMATE_SCHEMA, sorted(key_paths(written) - ESTIMATE_SCHEMA)


def test_a_sweep_and_a_what_if_are_read_and_written_back_to_the_byte() -> None:
    sweep, table = _sample("sweep"), _sample("what_if")
    assert json.dumps(Sweep.from_json(sweep).to_json(), indent=2) == json.dumps(sweep, indent=2)
    assert json.dumps(WhatIfTable.from_json(table).to_json(), indent=2) == json.dumps(table, indent=2)
    assert key_paths(sweep) <= SWEEP_SCHEMA, sorted(key_paths(sweep) - SWEEP_SCHEMA)
    assert key_paths(table) <= WHAT_IF_SCHEMA, sorted(key_paths(table) - WHAT_IF_SCHEMA)


def test_the_samples_cover_every_key_of_an_estimate() -> None:
    """Every key of a prediction and of a search is in a sample (the round trips above exercise
    it), but the data draws' spread: no sample's data decides its peak (tests/estimate/test_seeding.py
    has one, from a real run)."""
    seen = set().union(*(key_paths(_sample(name)) for name in ESTIMATES))
    keys = {path for path in _prediction("$") | {"$.max_batch", "$.what_if_check"} | _search("$.max_batch")}
    assert {path for path in keys - seen if ".verified." not in path} == {
        "$.data_spread.seeds",
        "$.data_spread.peak_bytes",
    }
    assert key_paths(_sample("sweep")) >= {"$.runs[].estimate.distributed.world_size", "$.fewest_gpus"}
    assert WHAT_IF_SCHEMA - key_paths(_sample("what_if")) == {
        "$.changes[].error",
        "$.not_applicable[].title",
        "$.not_applicable[].why",
    }


def test_a_search_whose_answer_is_the_first_trace_is_written_without_a_loop() -> None:
    """`--find-max-batch --format json` crashed ("Circular reference detected") when the script's
    own batch was the largest that fit: the answer's prediction was the estimate itself."""
    result = EstimateResult.from_json(_sample("search"))
    assert result.max_batch is not None
    result.max_batch.verified = result.prediction  # the same object, as the search can leave it
    written = json.loads(json.dumps(result.to_json()))
    assert written["max_batch"]["verified"]["peak_bytes"] == written["peak_bytes"]
