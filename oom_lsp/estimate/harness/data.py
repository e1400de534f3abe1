"""DataLoader: in-process (no workers), unpinned, its batch size overridden;
under fake mode one real batch is fetched outside it and replayed as fake
tensors for every iteration."""

from __future__ import annotations

import copy
import random
import weakref
from collections import UserDict

import torch
from torch.utils import _pytree as pytree
from torch.utils.data import DataLoader

from .common import has_exact_values
from .knobs import add_knob
from .seeding import RandomStates


def install(shims, request: dict, tracker, context, state: dict) -> None:
    fake_mode = state.get("fake_mode")
    batch_override = request.get("batch_size")
    state["loaders"] = []

    # DataLoader: in-process, unpinned, the batch size overridden; under fake
    # mode one real batch is fetched outside it (a TensorDataset's is made from
    # its shapes) and replayed as fake tensors.
    original_loader_init = DataLoader.__init__

    def loader_init(self, dataset, batch_size=1, *args, **kwargs):
        kwargs["num_workers"] = 0
        kwargs["pin_memory"] = False
        kwargs.pop("prefetch_factor", None)
        kwargs["persistent_workers"] = False
        if batch_override is not None and kwargs.get("batch_sampler") is None and batch_size is not None:
            batch_size = batch_override
            state["override_applied"].append("DataLoader(batch_size=...)")
        if batch_size is not None and kwargs.get("batch_sampler") is None:
            add_knob(state, context, "DataLoader(batch_size=...)")
            if state.get("loader_batch") is None:
                state["loader_batch"] = batch_size
        original_loader_init(self, dataset, batch_size, *args, **kwargs)
        record_loader(state, context, self)

    shims.patch(DataLoader, "__init__", loader_init)

    if fake_mode is not None:
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
        from torch.utils.data import (
            BatchSampler,
            IterableDataset,
            RandomSampler,
            SequentialSampler,
            TensorDataset,
        )
        from torch.utils.data._utils.collate import default_collate

        original_iter = DataLoader.__iter__

        def fetch_first_batch(loader):
            """The loader's own first batch, fetched outside fake mode, and the
            real twin of each of its tensors (None for floats, and for fake
            tensors: a fake dataset's values are unknown)."""
            tracker.paused += 1
            try:
                with unset_fake_temporarily():
                    try:
                        batch = next(iter(original_iter(loader)))
                    except StopIteration:
                        return None
            finally:
                tracker.paused -= 1
            twins = [
                None if isinstance(leaf, FakeTensor) or not has_exact_values(leaf) else leaf
                for leaf in batch_tensors(batch)
            ]
            return batch, twins

        def shapes(batch) -> list:
            return [tuple(leaf.shape) for leaf in batch_tensors(batch)]

        def draw_decides_shapes(loader, batch) -> bool:
            """Whether other draws of what the harness seeds (torch's generator, which the loader's
            shuffle draws from, Python's) give a first batch of other shapes: per-batch padding,
            random crops. The run's own random states are put back."""
            seen = shapes(batch)
            tracker.paused += 1
            try:
                with unset_fake_temporarily(), RandomStates():
                    for draw in (1, 2):
                        random.seed(state["seed"] + draw)
                        torch.manual_seed(state["seed"] + draw)
                        try:
                            other = next(iter(original_iter(loader)))
                        except StopIteration:
                            return False
                        if shapes(other) != seen:
                            return True
            finally:
                tracker.paused -= 1
            return False

        probed_loaders: weakref.WeakSet = weakref.WeakSet()

        def shuffled_by_harness(loader) -> bool:
            """A map-style loader whose sampler draws from torch's generator, which the harness
            seeds (shuffle=True, a RandomSampler given without a generator): iterating it again is
            safe, as it would not be for a stream."""
            if isinstance(loader.dataset, IterableDataset) or loader.generator is not None:
                return False
            samplers = (loader.sampler, getattr(loader.batch_sampler, "sampler", None))
            return any(hasattr(sampler, "generator") and sampler.generator is None for sampler in samplers)

        def is_plain_tensor_dataset(loader) -> bool:
            return (
                type(loader.dataset) is TensorDataset
                and loader.collate_fn is default_collate
                and type(loader.batch_sampler) is BatchSampler
                and type(loader.batch_sampler.sampler) in (SequentialSampler, RandomSampler)
            )

        def tensor_dataset_first_batch(loader):
            """What the default collate makes of a TensorDataset's first batch,
            without indexing it row by row (a fake dataset costs a fake op per
            row and tensor, then a fake stack): a fresh tensor per dataset
            tensor, (rows, *rest), contiguous, as torch.stack gives it; the twin
            of an integer one is the first rows of its real values, when known."""
            sampler = loader.batch_sampler
            available = len(sampler.sampler)
            if available == 0 or (sampler.drop_last and available < sampler.batch_size):
                return None
            rows = min(available, sampler.batch_size)
            tracker.paused += 1
            try:
                with fake_mode:
                    batch = [
                        torch.empty((rows, *tensor.shape[1:]), dtype=tensor.dtype)
                        for tensor in loader.dataset.tensors
                    ]
                with unset_fake_temporarily():
                    twins = []
                    for tensor in loader.dataset.tensors:
                        known = tracker.shadows.get(tensor) if isinstance(tensor, FakeTensor) else tensor
                        exact = known is not None and has_exact_values(tensor)
                        twins.append(known[:rows] if exact else None)
            finally:
                tracker.paused -= 1
            return batch, twins

        def loader_iter(self):
            first_batch = tensor_dataset_first_batch if is_plain_tensor_dataset(self) else fetch_first_batch
            fetched = first_batch(self)
            if fetched is None:
                return
            real_batch, twins = fetched
            if first_batch is fetch_first_batch and shuffled_by_harness(self) and self not in probed_loaders:
                probed_loaders.add(self)
                if draw_decides_shapes(self, real_batch):
                    state["data_varies"] = True
            wanted = self.batch_size
            leaves = batch_tensors(real_batch)
            got = leaves[0].shape[0] if leaves and leaves[0].dim() else None

            def to_fake(leaf):
                """A tensor of its own for each batch, as the loader collates a fresh one: a
                loop that holds the next batch while it runs this one (Lightning's fetcher,
                nanoGPT) holds two."""
                if not isinstance(leaf, torch.Tensor):
                    return leaf
                tracker.paused += 1
                try:
                    with fake_mode:
                        if wanted and got and got < wanted and leaf.dim() and leaf.shape[0] == got:
                            # A dataset smaller than the batch (a sample file, a larger
                            # --batch-size): the batch the real data would give.
                            return torch.empty((wanted, *leaf.shape[1:]), dtype=leaf.dtype)
                        return torch.empty_strided(leaf.shape, leaf.stride(), dtype=leaf.dtype)
                finally:
                    tracker.paused -= 1

            if wanted and got and got < wanted:
                state["batch_padded"] = [got, wanted]
            for _ in range(max(1, len(self)) if hasattr(self.dataset, "__len__") else 1_000_000):
                batch = map_batch(to_fake, real_batch)
                for fake, twin in zip(batch_tensors(batch), twins):
                    tracker.register(fake, False, "DataLoader", "inputs")
                    if twin is not None and fake.shape == twin.shape:
                        tracker.shadows[fake] = twin
                yield batch

        shims.patch(DataLoader, "__iter__", loader_iter)


def map_batch(fn, batch):
    """`fn` over a batch's leaves, as pytree maps them, and over the values of a `UserDict` too:
    Hugging Face's BatchEncoding (what tokenizers, `tokenizer.pad` and its data collators give) is
    one, and a leaf to pytree, so its tensors were neither replayed as fake tensors nor counted."""
    if isinstance(batch, UserDict):
        copied = copy.copy(batch)
        copied.data = {key: map_batch(fn, value) for key, value in batch.data.items()}
        return copied
    return pytree.tree_map(
        lambda leaf: map_batch(fn, leaf) if isinstance(leaf, UserDict) else fn(leaf), batch
    )


def batch_tensors(batch) -> list:
    found: list = []
    map_batch(lambda leaf: found.append(leaf) if isinstance(leaf, torch.Tensor) else None, batch)
    return found


def record_loader(state: dict, context, loader) -> None:
    """What a run that ends before two optimizer steps is explained with: a
    loader that gives fewer than two batches (a batch larger than the dataset
    with drop_last=True gives none)."""
    try:
        samples, batches = len(loader.dataset), len(loader)
    except TypeError:  # an IterableDataset without __len__
        samples = batches = None
    where = context.user_line()
    state["loaders"].append(
        {
            "file": where[0] if where else None,
            "line": where[1] if where else None,
            "samples": samples,
            "batch_size": loader.batch_size,
            "drop_last": bool(loader.drop_last),
            "batches": batches,
        }
    )
