"""Where rule classes register themselves: the `@register` decorator of every rule module.

The registry (`registry.all_rules`, `rule_for`) imports the rules package to fill this store;
the rule modules import this module, which imports none of them, so the two form no loop.
No libcst here: the registry must stay importable without it.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oom_lsp.analysis.rule import Rule

_CODE_RE = re.compile(r"^OOM\d{3}$")
_NAME_RE = re.compile(r"^[a-z0-9]+(-[a-z0-9]+)*$")
# code -> rule class, in the order the rule modules were imported.
REGISTERED: dict[str, type[Rule]] = {}


def register(rule: type[Rule]) -> type[Rule]:
    """Class decorator adding a rule to the registry."""
    if not _CODE_RE.match(rule.code):
        raise ValueError(f"{rule.__name__}: bad code {rule.code!r}")
    if not _NAME_RE.match(rule.name):
        raise ValueError(f"{rule.__name__}: name {rule.name!r} is not kebab-case")
    if rule.code in REGISTERED:
        raise ValueError(f"duplicate rule code {rule.code}")
    REGISTERED[rule.code] = rule
    return rule
