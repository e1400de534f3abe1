"""OOM6xx: scaling a model (gradient checkpointing, DataParallel)."""

from __future__ import annotations
