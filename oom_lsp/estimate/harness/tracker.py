"""The live-storage tracker: a TorchDispatchMode that counts, at the
dispatcher, the storages a real run would hold, and where each was made."""

from __future__ import annotations

import collections
import math
import weakref

import torch
from torch._subclasses.fake_tensor import DynamicOutputShapeException
from torch.utils._python_dispatch import TorchDispatchMode

from .branches import passing_outcome
from .common import CUDA_BLOCK, aten, has_exact_values, op_tensors
from .context import Context
from .cpu_kernels import CONVOLUTIONS, LOSS_BUFFERS, MATMULS
from .memo import FakeDispatchMemo

PRIM_DEVICE = torch.ops.prim.device.default
SHADOW_NUMEL_LIMIT = 50_000_000
# Random numbers a fake run draws for real outside the training step (see _replay_draw), at most:
# a model initialised at random beyond this (a billion-parameter model built from its config)
# would cost the estimate seconds and gigabytes; its draws are then skipped, and the run says so.
DRAW_REPLAY_LIMIT = 2**27

# The products cuBLAS runs (the runner counts them: no workspace without one).
MATMUL_PACKETS = ("mm", "addmm", "bmm", "baddbmm", "linear", "matmul")


class Record:
    __slots__ = ("category", "counted", "device", "line", "module", "nbytes", "serial")

    def __init__(self, serial, nbytes, device, category, module, line):
        self.serial = serial
        self.nbytes = nbytes
        self.device = device
        self.category = category
        self.module = module
        self.line = line
        self.counted = False


class StorageTracker(TorchDispatchMode):
    """Counts live storages at the dispatcher: each op output's untyped
    storage is registered once, and a weakref finaliser subtracts it when the
    storage dies (PyTorch keeps one Python object per StorageImpl)."""

    def __init__(self, context: Context, count_all: bool, round_cuda: bool, kernel_models: dict):
        super().__init__()
        self.context = context
        self.count_all = count_all
        self.round_cuda = round_cuda
        self.kernel_models = kernel_models
        self.live: dict[int, Record] = {}
        self.current = 0
        self.peak = 0
        self.peak_info: dict = {}
        self.by_category = collections.Counter()
        self.by_module = collections.Counter()
        self.by_line = collections.Counter()
        self.events: list[list[int]] = []  # [serial, signed size] of counted allocations, in order
        # With --snapshot/--html (request "timeline"): each counted allocation and free, in order,
        # with what the picture needs: [serial, size, category, op, phase, "file:line", module] for
        # an allocation, [serial, -size] for a free, [serial, 0, category] when what holds a live
        # storage becomes known (the first step's optimizer state) (estimate/timeline.py reads it).
        self.timeline: list[list] | None = None
        self.registered = 0
        self.paused = 0
        self.device_scope = 0
        self.stubbed_scalars = 0
        self.value_reads = 0  # `.item()`-like reads of one value (_local_scalar_dense)
        self.checks_passed = 0  # truth tests answered with the outcome that does not raise (branches.py)
        self.last_stubbed_read: tuple[str, int] | None = None  # the user's line of the last read answered 0
        self.value_arrays = 0  # `.numpy()` of fake tensors whose values only a real run knows (zeros)
        # Fake integer/bool tensors computed outside the training step (token
        # arrays, random indices, their slices) keep a real twin, so that
        # `data[i : i + block]` reads real indices instead of a stubbed 0.
        self.shadows = None
        self.fake_tensor_type = None  # FakeTensor, under fake mode
        self.fake_mode = None  # the run's FakeTensorMode, under fake mode
        self.fake_memo: FakeDispatchMemo | None = None  # under fake mode
        # A wrapper tensor's storage is its inner tensor's (distributed.py: a DTensor's local shard).
        self.unwrap = None
        self.op_counts = collections.Counter()
        # Where the first matrix product ran: CUDA allocates its cuBLAS workspace there (through the
        # caching allocator, with that call's frames: a real snapshot shows it at that line). None
        # until one ran; "" when it ran outside the user's code.
        self.first_matmul_line: str | None = None
        # data.BatchTrace under fake mode: which of the loaders' batches the script read last.
        self.batch_trace = None
        # Under fake mode: the elements of the random draws replayed for real, and skipped.
        self.draws: dict | None = None
        self.last_draw: tuple | None = None  # (op, its real result) of the last draw replayed

    # -- accounting --------------------------------------------------------

    def _size(self, storage, device: bool) -> int:
        nbytes = storage.nbytes()
        if device and self.round_cuda:
            return -(-nbytes // CUDA_BLOCK) * CUDA_BLOCK
        return nbytes

    def _count(self, record: Record, op: str) -> None:
        record.counted = True
        self.current += record.nbytes
        self.by_category[record.category] += record.nbytes
        self.by_module[record.module] += record.nbytes
        self.by_line[record.line] += record.nbytes
        self.events.append([record.serial, record.nbytes])
        if self.timeline is not None:
            self._timeline_alloc(record.serial, record.nbytes, record.category, op, record.line, record.module)
        self._count_peak(op)

    def _timeline_alloc(self, serial: int, nbytes: int, category: str, op: str, line: str, module: str) -> None:
        self.timeline.append([serial, nbytes, category, op, self.context.phase(), line, module])

    def _count_peak(self, op: str) -> None:
        # ">=": a later step that reaches the same peak has its optimizer
        # state categorised (the first step creates it as temporaries).
        if self.current >= self.peak:
            self.peak = self.current
            self.peak_info = {
                "op": op,
                "module": self.context.module(),
                "line": self.context.user_line(),
                "phase": self.context.phase(),
                "batch": self.batch_trace.current if self.batch_trace is not None else None,
                "by_category": dict(self.by_category),
                "by_module": dict(self.by_module),
                "by_line": dict(self.by_line),
            }

    def _uncount(self, record: Record) -> None:
        self.current -= record.nbytes
        self.by_category[record.category] -= record.nbytes
        self.by_module[record.module] -= record.nbytes
        self.by_line[record.line] -= record.nbytes
        self.events.append([record.serial, -record.nbytes])
        if self.timeline is not None:
            self.timeline.append([record.serial, -record.nbytes])

    def _finalize(self, key: int) -> None:
        record = self.live.pop(key, None)
        if record is not None and record.counted:
            self._uncount(record)

    def register(
        self, tensor: torch.Tensor, device: bool, op: str, category: str | None = None, extra: int = 0
    ):
        """Registers `tensor`'s storage if new; returns its record."""
        if self.unwrap is not None:
            tensor = self.unwrap(tensor)
        if tensor.layout != torch.strided and not tensor.is_nested:
            # A sparse tensor holds no storage of its own: its indices and values do (the
            # tensors it was built from, or new ones, as `coalesce` makes).
            for part in sparse_parts(tensor):
                self.register(part, device, op, category, extra)
                extra = 0
            return None
        if tensor.is_nested:
            return None
        # A fake tensor's own device (`.device` answers meta inside fake mode's kernels).
        device_type = (tensor.fake_device if type(tensor) is self.fake_tensor_type else tensor.device).type
        if device_type == "meta":
            # No memory anywhere: a model built on the meta device before its checkpoint is assigned.
            return None
        storage = tensor.untyped_storage()
        key = id(storage)
        record = self.live.get(key)
        if record is not None:
            return record
        if tensor.device.type == "meta":
            return None  # no memory: a model built on the meta device, before its weights are loaded
        line = self.context.user_line()
        record = Record(
            self.registered,
            self._size(storage, device) + extra,
            device,
            category or self.context.default_category(),
            self.context.module(),
            f"{line[0]}:{line[1]}" if line else "",
        )
        self.live[key] = record
        self.registered += 1
        weakref.finalize(storage, self._finalize, key)
        if device or self.count_all:
            self._count(record, op)
        return record

    def mark_device(self, tensor: torch.Tensor, op: str) -> None:
        """The script put `tensor` on the GPU (.to("cuda") returned it as is on the CPU)."""
        record = self.register(tensor, True, op)
        if record is None or record.device:
            return
        record.device = True
        if record.category == "other":
            self._recategorise(record, "inputs")
        if not record.counted:
            if self.round_cuda and record.nbytes:
                record.nbytes = -(-record.nbytes // CUDA_BLOCK) * CUDA_BLOCK
            self._count(record, op)

    def set_category(self, tensor: torch.Tensor, category: str) -> None:
        if not isinstance(tensor, torch.Tensor):
            return
        record = self.register(tensor, self.device_scope > 0 or self.context.in_step, "", category)
        if record is not None:
            self._recategorise(record, category)

    def _recategorise(self, record: Record, category: str) -> None:
        if record.counted:
            self.by_category[record.category] -= record.nbytes
            self.by_category[category] += record.nbytes
            if self.timeline is not None and category != record.category:
                self.timeline.append([record.serial, 0, category])  # held from now on as `category`
        record.category = category

    def storage_resized(self, tensor: torch.Tensor, op: str, category: str | None = None) -> None:
        """`tensor`'s storage was resized in place (`untyped_storage().resize_`, below the
        dispatcher: FSDP2 frees and reallocates its unsharded parameters so): its record
        follows the new size, as a free and an allocation."""
        record = self.register(tensor, self.device_scope > 0 or self.context.in_step, op, category)
        if record is None:
            return
        nbytes = self._size(tensor.untyped_storage(), record.device)
        if nbytes == record.nbytes:
            return
        if record.counted:
            self._uncount(record)
            record.counted = False
        record.nbytes = nbytes
        if nbytes and category is not None:
            record.category = category
        if nbytes and (record.device or self.count_all):
            self._count(record, op)

    def record_bytes(self, tensor: torch.Tensor) -> int:
        """What the tracker counts for `tensor`'s storage (0 when it does not count it)."""
        if self.unwrap is not None:
            tensor = self.unwrap(tensor)
        if tensor.layout != torch.strided and not tensor.is_nested:
            return sum(self.record_bytes(part) for part in sparse_parts(tensor))
        record = self.live.get(id(tensor.untyped_storage()))
        return record.nbytes if record is not None and record.counted else 0

    def is_device(self, tensor: torch.Tensor) -> bool:
        if self.unwrap is not None:
            tensor = self.unwrap(tensor)
        if tensor.layout != torch.strided and not tensor.is_nested:
            return any(self.is_device(part) for part in sparse_parts(tensor))
        record = self.live.get(id(tensor.untyped_storage()))
        return record is not None and record.device

    # -- dispatch ----------------------------------------------------------

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # TorchDispatchMode wraps a subclass's __torch_dispatch__ in
        # torch._dynamo.disable (a frame-evaluation switch around every op)
        # unless this is False; torch.compile is shimmed to eager, so dynamo
        # never traces the script.
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if (
            func is PRIM_DEVICE
            and type(args[0]) is self.fake_tensor_type
            and not args[0].fake_mode.in_kernel_invocation
        ):
            # Half of a fake run's dispatches ask for a fake tensor's device
            # (the autograd engine, above all): FakeTensorMode's answer outside
            # its kernels, without going through its dispatch.
            return args[0].fake_device
        kwargs = kwargs or {}
        if self.paused:
            if func is aten._local_scalar_dense.default and type(args[0]) is self.fake_tensor_type:
                # A value of the script's fake tensors read while the harness fetches a batch
                # outside fake mode (a Dataset's `int(self.targets[i])`): the script's read,
                # answered as in the run (its real twin, or a neutral value), not a crash.
                return self._local_scalar(func, args, kwargs)
            return func(*args, **kwargs)
        if self.batch_trace is not None and self.batch_trace.by_tensor:
            self.batch_trace.note(args)
        # Under inference_mode, `.item()` reaches this mode as aten.item (not yet decomposed into
        # _local_scalar_dense): the same read of one value.
        if func is aten._local_scalar_dense.default or func is aten.item.default:
            return self._local_scalar(func, args, kwargs)
        traits = _OP_TRAITS.get(func) or _op_traits(func)
        if traits.seeded and self.draws is not None and not self.context.in_step:
            self._replay_draw(func, args, kwargs)
        try:
            if self.fake_memo is not None:
                out = self.fake_memo.call(func, args, kwargs)
            else:
                out = func(*args, **kwargs)
        except DynamicOutputShapeException:
            # A shape only values decide (`edge_index[:, mask]`, nonzero, unique): known when every
            # input's values are (integer tensors the script loaded or computed from them).
            out = self._shaped_by_known_values(func, args, kwargs)
            if out is None:
                raise
        if func is aten._coalesce.default and type(args[0]) is self.fake_tensor_type:
            out = _coalesced_bound(args[0], out)
        self.op_counts[traits.packet] += 1
        if traits.matmul and self.first_matmul_line is None:
            line = self.context.user_line()
            self.first_matmul_line = f"{line[0]}:{line[1]}" if line else ""
        outputs = op_tensors((out,), [])
        if not outputs:
            return out  # a metadata query: nothing allocated
        inputs = None
        if self.shadows is not None and (
            not self.context.in_step
            # In the step, integer results of known values only (a GNN's edge index filtered
            # and extended at every forward): float ones are never kept.
            or all(has_exact_values(t) for t in outputs)
        ):
            inputs = op_tensors(kwargs.values(), op_tensors(args, []))
            self._shadow(func, args, kwargs, inputs, outputs)
        if traits.aliases:
            # Views and in-place ops allocate nothing. Checked by schema, not by
            # storage identity: a view of a real tensor, which fake mode converts,
            # reports a storage object of its own.
            return out
        device = self.device_scope > 0 or (self.context.in_step and not self.count_all)
        if not device:
            if inputs is None:
                inputs = op_tensors(kwargs.values(), op_tensors(args, []))
            device = any(self.is_device(t) for t in inputs)
        op = traits.name
        if func is aten.mkldnn_rnn_layer.default and "rnn_workspace" in self.kernel_models:
            extra = self.kernel_models["rnn_workspace"](self, args, outputs)
            for tensor in outputs[:-1]:
                self.register(tensor, device, op)
            self.register(outputs[-1], device, op, extra=extra)
            return out
        if func in LOSS_BUFFERS and "loss_buffers" in self.kernel_models:
            kept, transient = self.kernel_models["loss_buffers"](self, func, args, kwargs, outputs[0])
            self.register(outputs[0], device, op, extra=kept)
            self._transient(transient, op)
            return out
        for tensor in outputs:
            self.register(tensor, device, op)
        if func in CONVOLUTIONS and "conv_scratch" in self.kernel_models:
            self._transient(self.kernel_models["conv_scratch"](self, func, args), op)
        elif func is aten.mkldnn_rnn_layer_backward.default and "rnn_backward_scratch" in self.kernel_models:
            self._transient(self.kernel_models["rnn_backward_scratch"](self, args), op)
        elif func in MATMULS and "matmul_copies" in self.kernel_models:
            self._transient(self.kernel_models["matmul_copies"](func, args), op)
        return out

    def transient(self, size: int, op: str) -> None:
        """Memory alive for a moment outside any op the tracker sees (a batch's samples while the
        collate stacks them): a peak candidate only."""
        self._transient(size, op)

    def _transient(self, size: int, op: str) -> None:
        """Memory a kernel allocates and frees inside itself: a peak candidate only."""
        if size <= 0 or self.current + size < self.peak:
            return
        line = self.context.user_line()
        place = f"{line[0]}:{line[1]}" if line else ""
        # At its line too, as in the breakdown, the modules and the timeline (the page and
        # `explain` on the export name the same top lines as the estimate).
        self.by_category["temporaries"] += size
        self.by_module[self.context.module()] += size
        self.by_line[place] += size
        self.current += size
        if self.timeline is not None:
            # Serials below 0: no storage holds a kernel's scratch; it is freed before the op returns.
            serial = -1 - len(self.timeline)
            self._timeline_alloc(serial, size, "temporaries", op, place, self.context.module())
            self.timeline.append([serial, -size])
        self._count_peak(op)
        self.current -= size
        self.by_category["temporaries"] -= size
        self.by_module[self.context.module()] -= size
        self.by_line[place] -= size

    def _replay_draw(self, func, args, kwargs) -> None:
        """A fake op draws no random numbers; a real run's does, and what it draws next depends on
        how many were drawn before: a DataLoader's shuffle, drawn from torch's generator after the
        model's initial weights, gives other batches, so another peak (PEFT's LoRA example: 3 %).
        Outside the training step (initialisation, data preparation), each random op is run for
        real on ones of its arguments' shapes (its integer twins where known), so that torch's
        generator, or the script's own, advances as in a real run."""
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

        self.last_draw = None
        tensors = op_tensors(kwargs.values(), op_tensors(args, []))
        if any(tensor.device.type == "meta" for tensor in tensors) or str(kwargs.get("device")) == "meta":
            return  # a tensor without memory (a model built on the meta device) draws nothing
        # What the draw fills: its tensors, or the size a factory (randn, rand, randint) is given.
        elements = sum(tensor.numel() for tensor in tensors)
        for value in (*args, *kwargs.values()):
            if isinstance(value, (list, tuple)) and value and all(type(dim) is int for dim in value):
                elements += math.prod(value)
        if self.draws["elements"] + elements > DRAW_REPLAY_LIMIT:
            self.draws["skipped"] += elements
            return
        self.draws["elements"] += elements

        def to_real(value):
            if isinstance(value, FakeTensor):
                twin = self.shadows.get(value)
                if twin is not None:
                    return twin.clone()
                # Values only a real run knows: ones, a valid argument of every sampling op (the
                # weights of `multinomial` must not sum to 0, a `normal`'s std, a `poisson` rate,
                # a `bernoulli` probability); the count of numbers drawn depends on the shapes.
                return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype).fill_(1)
            if isinstance(value, torch.Tensor):
                return value.clone()  # a real tensor the fake op would leave as it is
            if type(value) is list or type(value) is tuple:
                return type(value)(to_real(item) for item in value)
            return value

        self.paused += 1
        try:
            with unset_fake_temporarily():
                drawn = func(*map(to_real, args), **{name: to_real(value) for name, value in kwargs.items()})
        finally:
            self.paused -= 1
        # The real values of this draw: the twin of an integer output (`_shadow`), drawn once.
        self.last_draw = (func, drawn)

    def _shadow(self, func, args, kwargs, inputs, outputs):
        if not outputs or not all(has_exact_values(t) for t in outputs):
            return
        if sum(t.numel() for t in outputs) > SHADOW_NUMEL_LIMIT:
            return
        if self.last_draw is not None and self.last_draw[0] is func:
            # A random op drawn for real already (`_replay_draw`), also from arguments whose
            # values are unknown (a policy's action from `Categorical(probs).sample()`: drawn on
            # ones, as a uniform policy would): the script reads those values, not a stubbed 0
            # (an RL episode of always the same action ends early: minimalRL's PPO batch was half
            # the real one); drawing again would leave torch's generator one draw further.
            real_out, self.last_draw = self.last_draw[1], None
        else:
            known = self._known_values(inputs)
            if known is None:
                return
            real_out = self._run_on(func, args, kwargs, known)
        for fake, twin in zip(outputs, op_tensors((real_out,), [])):
            self.shadows[fake] = twin

    def _known_values(self, inputs) -> dict[int, torch.Tensor] | None:
        """Each input's real values by id (its twin; a real tensor itself), or None when one's
        values are unknown."""
        from torch._subclasses.fake_tensor import FakeTensor

        known = {}
        for tensor in inputs:
            twin = self.shadows.get(tensor) if isinstance(tensor, FakeTensor) else tensor
            if twin is None:
                return None
            known[id(tensor)] = twin
        return known

    def _run_on(self, func, args, kwargs, known: dict[int, torch.Tensor]):
        """`func` run for real, outside fake mode and uncounted, on the known values of its tensors."""
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        def to_real(value):
            # An aten op's arguments: tensors, and lists and tuples of them (as _op_tensors walks them).
            if isinstance(value, torch.Tensor):
                return known[id(value)]
            if type(value) is list or type(value) is tuple:
                return type(value)(to_real(item) for item in value)
            return value

        self.paused += 1
        try:
            with unset_fake_temporarily():
                return func(*map(to_real, args), **{name: to_real(value) for name, value in kwargs.items()})
        finally:
            self.paused -= 1

    def _shaped_by_known_values(self, func, args, kwargs):
        """The op run for real on its inputs' values (their twins; real tensors as they are), and
        its outputs made fake tensors of the real shapes, each with its values as twin; None when
        some input's values are unknown."""
        from torch._subclasses.fake_tensor import FakeTensor

        if self.shadows is None or self.fake_mode is None:
            return None
        if func is aten.index.Tensor and not kwargs and type(args[0]) is FakeTensor and args[0] not in self.shadows:
            return self._indexed_by_known_masks(func, args)
        known = self._known_values(op_tensors(kwargs.values(), op_tensors(args, [])))
        if known is None:
            return None
        return self._fakes_of(self._run_on(func, args, kwargs, known))

    def _fakes_of(self, value):
        """Real tensors (in lists and tuples) as fake tensors of the same shapes, made uncounted in
        the run's fake mode, each integer one with its values as twin."""

        def to_fake(value):
            if isinstance(value, torch.Tensor):
                fake = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype)
                if has_exact_values(value):
                    self.shadows[fake] = value
                return fake
            if type(value) is list or type(value) is tuple:
                return type(value)(to_fake(item) for item in value)
            return value

        self.paused += 1
        try:
            with self.fake_mode:
                return to_fake(value)
        finally:
            self.paused -= 1

    def _indexed_by_known_masks(self, func, args):
        """`x[mask]` of a float tensor: its shape needs the mask's values only. Each boolean
        index whose values are known becomes the integer indices of its true entries (fake
        tensors with those values as twins), and fake mode indexes with them as it can."""
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

        source, indices = args[0], list(args[1])
        replaced = []
        for index in indices:
            if index is None or not (index.dtype == torch.bool or index.dtype == torch.uint8):
                replaced.append(index)
                continue
            twin = self.shadows.get(index) if isinstance(index, FakeTensor) else index
            if twin is None:
                return None
            self.paused += 1
            try:
                with unset_fake_temporarily():
                    positions = twin.nonzero().unbind(1)
            finally:
                self.paused -= 1
            replaced.extend(self._fakes_of(positions))
        return func(source, replaced)

    def _local_scalar(self, func, args, kwargs):
        from torch._subclasses.fake_tensor import DataDependentOutputException

        self.value_reads += 1
        if self.shadows is not None and args[0] in self.shadows:
            from torch._subclasses.fake_tensor import unset_fake_temporarily

            self.paused += 1
            try:
                with unset_fake_temporarily():
                    return self.shadows[args[0]].item()
            finally:
                self.paused -= 1
        try:
            return func(*args, **kwargs)
        except DataDependentOutputException:
            # `.item()` / `bool(t)` on a value only a real run knows (branches.py): a check that
            # raises on one outcome passes; anything else answers a neutral value, and a
            # data-dependent branch then goes one way.
            dtype = args[0].dtype
            outcome = passing_outcome()
            if outcome is not None:
                self.checks_passed += 1
            else:
                self.stubbed_scalars += 1
                self.last_stubbed_read = self.context.user_line()
            value = bool(outcome)
            if dtype == torch.bool:
                return value
            if dtype.is_floating_point or dtype.is_complex:
                return float(value)
            return int(value)


def _coalesced_bound(source: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Fake mode's `_coalesce` answers 0 entries (their number depends on the indices' values);
    the real result keeps one entry per distinct index, at most the input's: that bound, as new
    indices and values (exact when the indices hold no duplicates, as a graph's edges do)."""
    if out._nnz() >= source._nnz():
        return out
    return torch.sparse_coo_tensor(
        source._indices().clone(), source._values().clone(), source.shape, is_coalesced=True
    )


def sparse_parts(tensor: torch.Tensor) -> list:
    """The strided tensors that hold a sparse tensor's memory (COO: indices and values;
    compressed layouts: the compressed and plain indices and the values)."""
    layout = tensor.layout
    if layout == torch.sparse_coo:
        return [tensor._indices(), tensor._values()]
    if layout in (torch.sparse_csr, torch.sparse_bsr):
        return [tensor.crow_indices(), tensor.col_indices(), tensor.values()]
    if layout in (torch.sparse_csc, torch.sparse_bsc):
        return [tensor.ccol_indices(), tensor.row_indices(), tensor.values()]
    return []  # mkldnn and other opaque layouts: not traced


_NEW_DESPITE_SCHEMA = frozenset({aten.lift_fresh.default, aten.coalesce.default})


class OpTraits:
    """What the tracker reads of an operator on each call, worked out once."""

    __slots__ = ("aliases", "matmul", "name", "packet", "seeded")

    def __init__(self, func):
        self.name = f"aten.{func.__name__ if hasattr(func, '__name__') else func}"
        self.packet = func.overloadpacket.__name__
        self.matmul = self.packet in MATMUL_PACKETS
        # Ops whose schema says they alias their input but that return new storage: lift_fresh
        # (its input is the real tensor `torch.tensor(data)` just made outside the mode: missed
        # before, `torch.tensor(list)` outside the step was left out under --device cpu) and
        # coalesce (self when already coalesced, else new indices and values). `register` counts
        # a storage once, so the aliasing case adds nothing.
        self.aliases = func not in _NEW_DESPITE_SCHEMA and any(
            ret.alias_info is not None for ret in func._schema.returns
        )
        self.seeded = torch.Tag.nondeterministic_seeded in func.tags


_OP_TRAITS: dict = {}


def _op_traits(func) -> OpTraits:
    traits = _OP_TRAITS[func] = OpTraits(func)
    return traits
