"""Every rule code, its name and whether it is on by default.

GENERATED from the rule classes (`oom_lsp/analysis/rules/`) and the meta rules
of `oom_lsp/analysis/registry.py` by
`python -m oom_lsp.analysis.registry --write-catalogue`; do not edit by hand
(tests/analysis/test_registry.py fails when it is stale).

This table is the public interface of RULES.md (codes never change meaning)
and it is readable without importing the rules themselves, which pull in
libcst: resolving a configuration and answering a run from the results cache
need only codes and names.
"""

from __future__ import annotations

# (code, name, enabled by default)
CATALOGUE: tuple[tuple[str, str, bool], ...] = (
    ("OOM000", "invalid-syntax", True),
    ("OOM100", "predicted-out-of-memory", True),
    ("OOM101", "large-batch-size", False),
    ("OOM102", "dataset-on-device", True),
    ("OOM103", "predicted-memory-growth", True),
    ("OOM201", "no-mixed-precision", True),
    ("OOM202", "float64", True),
    ("OOM301", "loss-accumulated-with-graph", True),
    ("OOM302", "tensor-kept-across-iterations", True),
    ("OOM303", "eval-without-no-grad", True),
    ("OOM304", "retain-graph-in-loop", True),
    ("OOM305", "hidden-state-carried-across-batches", True),
    ("OOM306", "device-tensors-kept-across-iterations", True),
    ("OOM307", "backward-create-graph", True),
    ("OOM308", "metric-never-reset", True),
    ("OOM401", "cat-in-loop", True),
    ("OOM402", "naive-attention", True),
    ("OOM501", "torch-load-without-map-location", True),
    ("OOM502", "empty-cache-in-loop", True),
    ("OOM503", "zero-grad-keeps-grads", True),
    ("OOM601", "no-gradient-checkpointing", True),
    ("OOM602", "data-parallel-gather", True),
    ("OOM603", "ddp-bucket-copy", False),
    ("OOM701", "failed-cell-keeps-tensors", True),
    ("OOM702", "cell-output-keeps-graph", True),
    ("OOM703", "model-rebuilt-while-held", True),
    ("OOM900", "unused-suppression", False),
)

CODES: tuple[str, ...] = tuple(code for code, _, _ in CATALOGUE)
DEFAULT_CODES: tuple[str, ...] = tuple(code for code, _, enabled in CATALOGUE if enabled)
CODE_BY_NAME: dict[str, str] = {name: code for code, name, _ in CATALOGUE}
NAME_BY_CODE: dict[str, str] = {code: name for code, name, _ in CATALOGUE}
