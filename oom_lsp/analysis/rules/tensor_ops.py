"""OOM4xx: tensor operations that allocate more than they need."""

from __future__ import annotations
