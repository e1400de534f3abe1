"""Seeds what the harness controls, so that an estimate does not move from run to run: Python's
`random`, NumPy's global generator and torch's (each run starts from the request's seed). A script
that seeds itself overrides these, as it would in a real run.

A DataLoader without a generator of its own draws its shuffle from torch's global generator, after
the model's initial weights: a fake run draws those for real (tracker.py, `_replay_draw`), so that
its loaders shuffle as a real run's do, seeded like it."""

from __future__ import annotations

import importlib.util
import random
import sys

import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    numpy = sys.modules.get("numpy")
    if numpy is None and "numpy" not in sys.modules and importlib.util.find_spec("numpy") is not None:
        import numpy
    if numpy is not None:
        numpy.random.seed(seed)


class RandomStates:
    """Python's, NumPy's and torch's global random states, put back on exit: what the harness
    draws for itself must not change what the script draws."""

    def __enter__(self):
        numpy = sys.modules.get("numpy")
        self.saved = (
            random.getstate(),
            numpy.random.get_state() if numpy is not None else None,
            torch.get_rng_state(),
        )
        return self

    def __exit__(self, *exc):
        python, numpy_state, torch_state = self.saved
        random.setstate(python)
        if numpy_state is not None:
            sys.modules["numpy"].random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        return False
