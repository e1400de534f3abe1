"""The rule catalogue (../RULES.md), one module per family.

Importing this package registers every rule.
"""

from oom_lsp.analysis.rules import (  # noqa: F401
    accumulation,
    attention,
    concatenation,
    data,
    evaluation,
    hidden_state,
    precision,
    retain_graph,
    runtime,
    scale,
)
