"""The rule catalogue (../RULES.md), one module per family.

Importing this package registers every rule.
"""

from oom_lsp.analysis.rules import (  # noqa: F401
    accumulation,
    attention,
    checkpoint_loading,
    concatenation,
    data,
    evaluation,
    float64,
    hidden_state,
    kept_tensors,
    mixed_precision,
    notebook,
    retain_graph,
    runtime,
    scale,
)
