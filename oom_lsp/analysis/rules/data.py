"""OOM1xx: how much data a step holds (batch size, datasets on the device)."""

from __future__ import annotations
