"""Seeds what the harness controls, so that an estimate does not move from run to run: Python's
`random`, NumPy's global generator, torch's (each run starts from the request's seed), and every
DataLoader's shuffle (`seeded_generator`). A script that seeds itself overrides these, as it
would in a real run.

A DataLoader without a generator of its own draws its shuffle from torch's global generator,
where a real run has drawn its model's initial weights before and a fake run has not (fake
tensors draw nothing): each loader gets a generator of its own, seeded from the run's seed and
the loader's rank, so that the fake run and a real run under the harness shuffle alike."""

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


def seeded_generator(seed: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + rank)


def seed_samplers(generator: torch.Generator, *samplers) -> None:
    """Samplers given to a DataLoader (RandomSampler, SubsetRandomSampler, WeightedRandomSampler,
    and the one inside a BatchSampler) that would draw from torch's global generator."""
    for sampler in samplers:
        inner = getattr(sampler, "sampler", None)
        for candidate in (sampler, inner):
            if candidate is not None and hasattr(candidate, "generator") and candidate.generator is None:
                candidate.generator = generator


class RandomStates:
    """Python's, NumPy's and torch's global random states, and a generator's, put back on exit:
    what the harness draws for itself must not change what the script draws."""

    def __init__(self, *generators: torch.Generator):
        self.generators = generators

    def __enter__(self):
        numpy = sys.modules.get("numpy")
        self.saved = (
            random.getstate(),
            numpy.random.get_state() if numpy is not None else None,
            torch.get_rng_state(),
            [generator.get_state() for generator in self.generators],
        )
        return self

    def __exit__(self, *exc):
        python, numpy_state, torch_state, generator_states = self.saved
        random.setstate(python)
        if numpy_state is not None:
            sys.modules["numpy"].random.set_state(numpy_state)
        torch.set_rng_state(torch_state)
        for generator, state in zip(self.generators, generator_states):
            generator.set_state(state)
        return False
