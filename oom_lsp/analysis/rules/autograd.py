"""OOM3xx: autograd graphs kept alive longer than a step."""

from __future__ import annotations
