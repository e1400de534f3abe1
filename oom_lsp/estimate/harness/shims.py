"""Every patch around the script goes through `Shims`, and is undone after
the run; `install_shims` installs them all, concern by concern."""

from __future__ import annotations

import functools
import sys
import types

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

    def patch_everywhere(self, owner, name, replacement):
        """`owner.name = replacement`, and in every imported module that bound the original under
        any name (`from safetensors.torch import save_file as safe_save_file`). A module imported
        during the run binds the replacement for good: after undo it calls the original, and the
        next run's patch finds it by what it replaces."""
        current = getattr(owner, name)
        original = getattr(current, "_oom_lsp_replaces", current)
        active = [True]

        @functools.wraps(original)
        def dispatch(*args, **kwargs):
            return (replacement if active[0] else original)(*args, **kwargs)

        dispatch._oom_lsp_replaces = original
        for module in list(sys.modules.values()):
            names = getattr(module, "__dict__", None)  # never a lazy module's __getattr__
            if not isinstance(names, dict) or module is owner:
                continue
            for bound, value in list(names.items()):
                if value is original or (
                    type(value) is types.FunctionType and value.__dict__.get("_oom_lsp_replaces") is original
                ):
                    self.patch(module, bound, dispatch)
        self.patch(owner, name, dispatch)
        self.at_undo(lambda: active.__setitem__(0, False))
        return original

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
