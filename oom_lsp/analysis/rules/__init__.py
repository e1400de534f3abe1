"""The rule catalogue (../RULES.md), one module per family.

Importing this package registers every rule.
"""

from oom_lsp.analysis.rules import (  # noqa: F401
    attention,
    autograd,
    concatenation,
    data,
    precision,
    runtime,
    scale,
)
