"""Progress events to the parent (--progress-fd), one JSON line each:
{"event": "ready"} once torch is imported, {"event": "run-start", "batch_size"},
{"event": "step", "step"}, {"event": "run"} per run."""

from __future__ import annotations

import json
import os

_channel = None


def open_channel(fd: int) -> None:
    global _channel
    _channel = os.fdopen(fd, "w", buffering=1)


def emit(event: str, **fields) -> None:
    if _channel is None:
        return
    try:
        _channel.write(json.dumps({"event": event, **fields}) + "\n")
    except OSError:  # the parent stopped listening: the run goes on, progress is a convenience
        pass
