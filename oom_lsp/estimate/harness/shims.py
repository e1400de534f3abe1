"""Every patch around the script goes through `Shims`, and is undone after
the run; `install_shims` installs them all, concern by concern."""

from __future__ import annotations

from . import changes, cuda, data, distributed, fakes, knobs, pretrained, quantized, training, values

_MISSING = object()


class Shims:
    """Everything patched around the script, restored by `undo()`."""

    def __init__(self):
        self._undo: list = []

    def patch(self, owner, name, value):
        """`owner.name = value` until undo; a name `owner` lacked (what a CUDA build of torch
        has and a CPU build lacks) is removed again."""
        original = getattr(owner, name, _MISSING)
        setattr(owner, name, value)
        self._undo.append((owner, name, original))
        return None if original is _MISSING else original

    def at_undo(self, callback):
        """`callback()` on undo, in the same reverse order as the patches."""
        self._undo.append((None, None, callback))

    def undo(self):
        for owner, name, original in reversed(self._undo):
            if owner is None:
                original()
            elif original is _MISSING:
                delattr(owner, name)
            else:
                setattr(owner, name, original)


def install_shims(shims: Shims, request: dict, tracker, context, state: dict) -> None:
    cuda.install(shims, request, state)
    training.install(shims, request, tracker, context, state)
    data.install(shims, request, tracker, context, state)
    knobs.install(shims, request, context, state)
    changes.install(shims, request, state)
    # Offline; under fake mode, safetensors checkpoints by their headers.
    pretrained.install(shims, state)
    quantized.install(shims, state)
    if state.get("fake_mode") is not None:
        values.install(shims, tracker)
        fakes.install(shims)
    # torchrun-style scripts as rank 0 of N (only when the request has "distributed").
    distributed.install(shims, request, tracker, context, state)
