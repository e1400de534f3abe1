"""DataLoader: in-process (no workers), unpinned, its batch size overridden; under fake mode each
batch the loader really yields is fetched outside fake mode (the dataset and the collate function
run for real: per-batch padding gives each batch its own length) and handed to the script as fake
tensors. `BatchTrace` records each batch's shapes and which one the script read last, so that the
peak says which batch (step, micro-batch) it happened with. When the batches differ in shape, the
longest batch the data can produce (the `batch_size` largest samples, collated) is kept for the
worst-case run (`worst_batches` in the request)."""

from __future__ import annotations

import collections
import copy
import functools
import random
import time
import weakref

import torch
from torch.utils import _pytree as pytree
from torch.utils.data import DataLoader

from .common import has_exact_values
from .knobs import add_knob
from .seeding import RandomStates

# How long the search for the longest batch may read the dataset's samples.
WORST_CASE_SCAN_SECONDS = 3.0
# Batches listed in the result (the first ones; the peak's is reported whatever its rank).
LISTED_BATCHES = 64


def batch_leaves(batch, path: str = "") -> list[tuple[str, torch.Tensor]]:
    """The tensors of a batch with where they are in it ("input_ids", "0", "1.pixels"): dicts,
    mappings that pytree takes for leaves (a `BatchEncoding` is a `UserDict`), lists, tuples and
    named tuples, and whatever pytree knows."""
    if isinstance(batch, torch.Tensor):
        return [(path, batch)]
    join = (lambda key: f"{path}.{key}") if path else str
    if isinstance(batch, collections.abc.Mapping):
        return [leaf for key, value in batch.items() for leaf in batch_leaves(value, join(key))]
    if isinstance(batch, (list, tuple)):
        return [leaf for index, value in enumerate(batch) for leaf in batch_leaves(value, join(index))]
    leaves = pytree.tree_leaves(batch)
    if len(leaves) == 1 and leaves[0] is batch:
        return []
    return [leaf for index, value in enumerate(leaves) for leaf in batch_leaves(value, join(index))]


def map_batch(fn, batch):
    """`batch` with each tensor replaced by `fn(tensor)`, its containers rebuilt as they were."""
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if type(batch) is dict:
        return {key: map_batch(fn, value) for key, value in batch.items()}
    if isinstance(batch, collections.UserDict):
        rebuilt = copy.copy(batch)
        rebuilt.data = {key: map_batch(fn, value) for key, value in batch.data.items()}
        return rebuilt
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(map_batch(fn, value) for value in batch))
    if type(batch) in (list, tuple):
        return type(batch)(map_batch(fn, value) for value in batch)
    return pytree.tree_map(lambda leaf: map_batch(fn, leaf) if leaf is not batch else leaf, batch)


def shapes_of(batch) -> dict[str, list[int]]:
    return {path: list(tensor.shape) for path, tensor in batch_leaves(batch)}


def _sample_size(sample) -> int:
    """How much a sample holds: elements of its tensors and arrays, lengths of its token lists."""
    if isinstance(sample, torch.Tensor):
        return sample.numel()
    size = getattr(sample, "size", None)
    if isinstance(size, int) and hasattr(sample, "shape"):  # a NumPy array
        return size
    if isinstance(sample, collections.abc.Mapping):
        return sum(_sample_size(value) for value in sample.values())
    if isinstance(sample, (list, tuple)):
        if sample and all(isinstance(item, (int, float, bool)) for item in sample):
            return len(sample)
        return sum(_sample_size(item) for item in sample)
    return 0


class BatchTrace:
    """The batches the loaders yielded to the script, and the one it read last (the tracker calls
    `read` when an op takes one of a batch's tensors): a batch's step and micro-batch are those of
    its first read, so that a loader that fetches ahead (Accelerate's, the Trainer's eight
    micro-batches) still numbers them in the order the script uses them."""

    def __init__(self, state: dict):
        self.state = state
        self.by_tensor: dict[int, dict] = {}
        self.batches: list[dict] = []
        self.current: dict | None = None
        self._step = 0
        self._micro: collections.Counter = collections.Counter()

    def add(self, loader: dict, index: int, batch) -> dict:
        record = {
            "loader": loader,
            "index": index,
            "shapes": shapes_of(batch),
            "step": None,
            "micro_batch": None,
            "worst": False,
        }
        self.batches.append(record)
        for _, tensor in batch_leaves(batch):
            key = id(tensor)
            self.by_tensor[key] = record
            weakref.finalize(tensor, self.by_tensor.pop, key, None)
        return record

    def note(self, args) -> None:
        for value in args:
            record = self.by_tensor.get(id(value))
            if record is not None and record is not self.current:
                self.read(record)

    def read(self, record: dict) -> None:
        if record["step"] is None:
            steps = self.state["steps"]
            if steps != self._step:
                self._step = steps
                self._micro.clear()
            self._micro[id(record["loader"])] += 1
            record["step"] = steps + 1
            record["micro_batch"] = self._micro[id(record["loader"])]
        self.current = record

    @staticmethod
    def describe(record: dict | None) -> dict | None:
        if record is None:
            return None
        loader = record["loader"]
        return {
            "step": record["step"],
            "micro_batch": record["micro_batch"],
            "index": record["index"],
            "shapes": record["shapes"],
            "loader": {"file": loader["file"], "line": loader["line"]},
            "worst": record["worst"],
        }


def install(shims, request: dict, tracker, context, state: dict) -> None:
    fake_mode = state.get("fake_mode")
    batch_override = request.get("batch_size")
    state["loaders"] = []

    # DataLoader: in-process, unpinned, the batch size overridden; under fake
    # mode each batch is fetched outside it and handed on as fake tensors.
    original_loader_init = DataLoader.__init__

    # Each loader's entry in state["loaders"] (its rank there names it across runs).
    loader_records: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

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
        loader_records[self] = record_loader(state, context, self)

    shims.patch(DataLoader, "__init__", loader_init)

    if fake_mode is None:
        return
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
    from torch.utils.data import (
        BatchSampler,
        IterableDataset,
        RandomSampler,
        SequentialSampler,
        TensorDataset,
    )
    from torch.utils.data._utils.collate import default_collate

    trace = state["batch_trace"] = BatchTrace(state)
    tracker.batch_trace = trace
    # From an earlier run in this interpreter: the longest batch of each loader, by rank.
    worst_batches: dict = request.get("worst_batches") or {}
    state["worst_found"] = {}
    original_iter = DataLoader.__iter__

    class Outside:
        """Real tensors, uncounted: what the harness does for itself in the middle of the run."""

        def __enter__(self):
            tracker.paused += 1
            self.unset = unset_fake_temporarily()
            self.unset.__enter__()

        def __exit__(self, *exc):
            self.unset.__exit__(*exc)
            tracker.paused -= 1
            return False

    def twins_of(batch) -> list:
        """The real twin of each tensor of a real batch (None for floats, and for fake tensors:
        a fake dataset's values are unknown)."""
        return [
            None if isinstance(leaf, FakeTensor) or not has_exact_values(leaf) else leaf
            for _, leaf in batch_leaves(batch)
        ]

    def real_batches(loader):
        """The batches the loader yields, each fetched outside fake mode, with their twins; and
        what its collate function was handed in this process (see `collated`)."""
        collate = loader.collate_fn

        def measured_collate(samples):
            collated["bytes"] = samples_bytes(samples)
            return collate(samples)

        with Outside():
            # The iterator takes the collate function when it is made. Worker processes collate
            # in their own memory: there `collated` stays 0, as the main process holds nothing.
            loader.collate_fn = measured_collate
            try:
                iterator = original_iter(loader)
            finally:
                loader.collate_fn = collate
        while True:
            collated["bytes"] = 0
            with Outside():
                try:
                    batch = next(iterator)
                except StopIteration:
                    return
            yield batch, twins_of(batch)

    def draw_decides_shapes(loader, batch) -> bool:
        """Whether other draws of what the harness seeds (torch's generator, which the loader's
        shuffle draws from, Python's) give a first batch of other shapes: per-batch padding,
        random crops. The run's own random states are put back."""
        seen = shapes_of(batch)
        with Outside(), RandomStates():
            for draw in (1, 2):
                random.seed(state["seed"] + draw)
                torch.manual_seed(state["seed"] + draw)
                try:
                    other = next(iter(original_iter(loader)))
                except StopIteration:
                    return False
                if shapes_of(other) != seen:
                    return True
        return False

    # The samples the last batch was collated from, in bytes: tensors each sample made for
    # itself (`ToTensor()` of an image), alive with the batch stacked from them until the collate
    # returns, while the loop still holds the previous batch.
    collated = {"bytes": 0}

    probed_loaders: weakref.WeakSet = weakref.WeakSet()
    scanned_loaders: weakref.WeakSet = weakref.WeakSet()
    first_batch_shapes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

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

    def tensor_dataset_batches(loader):
        """What the default collate makes of a TensorDataset's batches, without indexing it row by
        row (a fake dataset costs a fake op per row and tensor, then a fake stack): a fresh tensor
        per dataset tensor, (rows, *rest), contiguous, as torch.stack gives it, the last batch
        short unless drop_last; the twin of an integer one is the first rows of its real values,
        when known."""
        sampler = loader.batch_sampler
        available = len(sampler.sampler)
        for start in range(0, available, sampler.batch_size):
            rows = min(sampler.batch_size, available - start)
            if sampler.drop_last and rows < sampler.batch_size:
                return
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
            yield batch, twins

    def longest_batch(loader, rank: int) -> None:
        """The longest batch the data can produce: the loader's `batch_size` samples that hold the
        most (token lists, tensors), collated by its own collate function, found by reading the
        samples (for at most WORST_CASE_SCAN_SECONDS); kept for the worst-case run."""
        dataset = loader.dataset
        # A loader given a batch sampler (Accelerate's shard of the Trainer's loader) has its size there.
        size = loader.batch_size or getattr(loader.batch_sampler, "batch_size", None)
        drop_last = (
            loader.drop_last if loader.batch_size else getattr(loader.batch_sampler, "drop_last", False)
        )
        try:
            count = len(dataset)
        except TypeError:  # a stream: its longest batch is unknown
            return
        if not isinstance(size, int) or count == 0 or (drop_last and count < size):
            return
        started, sizes = time.perf_counter(), []
        with Outside(), RandomStates():
            fetch = getattr(dataset, "__getitems__", None)
            for start in range(0, count, 256):
                indices = list(range(start, min(count, start + 256)))
                samples = fetch(indices) if fetch else [dataset[index] for index in indices]
                sizes += [_sample_size(sample) for sample in samples]
                if time.perf_counter() - started > WORST_CASE_SCAN_SECONDS:
                    break
            chosen = sorted(range(len(sizes)), key=lambda index: -sizes[index])[: min(size, count)]
            samples = fetch(chosen) if fetch else [dataset[index] for index in chosen]
            batch = loader.collate_fn(samples)
        state["worst_found"][rank] = {
            "batch": batch,
            "batch_size": size,
            "drop_last": bool(drop_last),
            "shapes": shapes_of(batch),
            "elements": sum(tensor.numel() for _, tensor in batch_leaves(batch)),
            "samples": count,
            "scanned": len(sizes),
        }

    def worst_replay(worst, count: int):
        """The longest batch, a fresh copy for each of the loader's batches."""
        for _ in range(count):
            with Outside():
                batch = map_batch(torch.clone, worst)
            yield batch, twins_of(batch)

    def to_fake(leaf, rows):
        """A batch's tensor as a fake tensor of its own, as the loader collates a fresh one (a
        loop that holds the next batch while it runs this one, Lightning's fetcher or nanoGPT's,
        holds two); with `rows` (got, wanted), one of `got` rows as one of `wanted`."""
        tracker.paused += 1
        try:
            with fake_mode:
                if rows and leaf.dim() and leaf.shape[0] == rows[0]:
                    return torch.empty((rows[1], *leaf.shape[1:]), dtype=leaf.dtype)
                return torch.empty_strided(leaf.shape, leaf.stride(), dtype=leaf.dtype)
        finally:
            tracker.paused -= 1

    def loader_iter(self):
        record = loader_records.get(self) or record_loader(state, context, self)
        rank = next(index for index, known in enumerate(state["loaders"]) if known is record)
        worst = worst_batches.get(rank)
        if worst is not None:
            batches = worst_replay(worst, len(self) if hasattr(self.dataset, "__len__") else 2**31)
        elif is_plain_tensor_dataset(self):
            batches = tensor_dataset_batches(self)
        else:
            batches = real_batches(self)
        wanted = self.batch_size
        try:
            smaller_than_a_batch = len(self.dataset) < (wanted or 0)
        except TypeError:
            smaller_than_a_batch = False
        for index, (real_batch, twins) in enumerate(batches, 1):
            leaves = batch_leaves(real_batch)
            if (
                index == 1
                and worst is None
                and not is_plain_tensor_dataset(self)
                and shuffled_by_harness(self)
                and self not in probed_loaders
            ):
                probed_loaders.add(self)
                if draw_decides_shapes(self, real_batch):
                    state["data_varies"] = True
            got = leaves[0][1].shape[0] if leaves and leaves[0][1].dim() else None
            # A dataset smaller than the batch (a sample file, a larger --batch-size): the batch
            # the real data would give.
            rows = (got, wanted) if smaller_than_a_batch and wanted and got and got < wanted else None
            if rows:
                state["batch_padded"] = list(rows)
            batch = map_batch(functools.partial(to_fake, rows=rows), real_batch)
            for (_, fake), twin in zip(batch_leaves(batch), twins):
                tracker.register(fake, False, "DataLoader", "inputs")
                if twin is not None and fake.shape == twin.shape:
                    tracker.shadows[fake] = twin
            if collated["bytes"] and not rows and tracker.count_all:
                # Host memory: counted where the estimate is of the CPU's (--device cpu) only.
                tracker.transient(collated["bytes"], "DataLoader")
            collated["bytes"] = 0
            traced = trace.add(record, index, batch)
            traced["worst"] = worst is not None
            shapes = {path: shape[1:] for path, shape in traced["shapes"].items()}
            # Compared with the loader's first batch of any pass (a sanity check's pass gives one).
            first_shapes = first_batch_shapes.setdefault(self, shapes)
            if (
                shapes != first_shapes
                and request.get("worst_case")
                and worst is None
                and self not in scanned_loaders
            ):
                # The batches differ beyond their number of rows: per-batch padding, variable sizes.
                scanned_loaders.add(self)
                longest_batch(self, rank)
            yield batch

    shims.patch(DataLoader, "__iter__", loader_iter)


def samples_bytes(samples) -> int:
    """The bytes of the tensors among `samples` that own their storage whole (a view of a data
    set's tensor, `data[i]`, allocates nothing); NumPy arrays and numbers are not torch's."""
    total = 0
    pending = [samples]
    while pending:
        value = pending.pop()
        if isinstance(value, torch.Tensor):
            size = value.numel() * value.element_size()
            if value.layout == torch.strided and value.untyped_storage().nbytes() == size:
                total += size
        elif isinstance(value, dict):
            pending.extend(value.values())
        elif isinstance(value, (list, tuple)):
            pending.extend(value)
    return total


def record_loader(state: dict, context, loader) -> dict:
    """What a run that ends before two optimizer steps is explained with: a
    loader that gives fewer than two batches (a batch larger than the dataset
    with drop_last=True gives none)."""
    try:
        samples, batches = len(loader.dataset), len(loader)
    except TypeError:  # an IterableDataset without __len__
        samples = batches = None
    where = context.user_line()
    record = {
        "file": where[0] if where else None,
        "line": where[1] if where else None,
        "samples": samples,
        "batch_size": loader.batch_size,
        "drop_last": bool(loader.drop_last),
        "batches": batches,
    }
    state["loaders"].append(record)
    return record
