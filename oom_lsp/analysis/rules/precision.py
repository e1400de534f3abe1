"""OOM2xx: numeric precision (mixed precision, float64)."""

from __future__ import annotations
