"""Runs a user's training script, unchanged, and measures the peak memory of
its first two optimizer steps. Executed INSIDE the user's interpreter by
`oom-lsp estimate`: it imports torch, and nothing from oom_lsp (the user's
environment need not have oom_lsp installed), so it is run by file path.

    python harness.py --request request.json

Modes (`mode` in the request):
- "fake": the script runs under FakeTensorMode on the fake *cpu* device
  (faking `cuda` on a CPU-only wheel aborts the process in backward, see
  docs/estimate.md). Tensors have shapes and dtypes but no storage; a
  dispatcher-level live-storage tracker counts what a real run would hold.
- "real": the same shims and tracker on real CPU tensors (the fallback when
  something cannot be faked), optionally with the profiler's alloc/free
  replay (`profile_replay`), the ground truth of tests and benchmarks; with
  `track: false`, no tracker either: a bare real run, which benchmarks time.

The script believes it has a GPU: `torch.cuda.is_available()` is True, and
`device="cuda"`, `.cuda()`, `.to("cuda")`, `autocast("cuda")` are rewritten to
the CPU. With `count="device"` only storages the script put on the GPU (and
whatever is computed from them, or allocated inside a training step) count;
with `count="all"` every storage counts (what a real CPU step measures).

The result is one JSON object written to `output`; the script's own stdout
and stderr are left alone.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import os
import runpy
import sys
import time
import traceback
import warnings
import weakref

NO_TORCH_EXIT = 3  # what oom_lsp.profiling.runner reads as "this interpreter has no torch"
# torch warns at import when NumPy is not installed; that is the environment, not the script.
warnings.filterwarnings("ignore", message="Failed to initialize NumPy")

try:
    import torch
except ImportError:
    sys.stderr.write(f"oom-lsp estimate: {sys.executable} cannot import torch\n")
    sys.exit(NO_TORCH_EXIT)
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
PRIM_DEVICE = torch.ops.prim.device.default

CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations", "temporaries", "inputs", "other")
BATCH_OPTION_NAMES = {
    "batch_size",
    "bs",
    "batch",
    "train_batch_size",
    "per_device_train_batch_size",
    "micro_batch_size",
}
CUDA_BLOCK = 512
SHADOW_NUMEL_LIMIT = 50_000_000
HARNESS_FILE = os.path.abspath(__file__)


# JSON lines to the parent (--progress-fd): {"event": "ready"} once torch is imported,
# {"event": "run-start", "batch_size"}, {"event": "step", "step"}, {"event": "run"} per run.
_progress = None


def _emit(event: str, **fields) -> None:
    if _progress is None:
        return
    try:
        _progress.write(json.dumps({"event": event, **fields}) + "\n")
    except OSError:  # the parent stopped listening: the run goes on, progress is a convenience
        pass


class StopEstimate(BaseException):
    """Raised from the optimizer's step post hook after the last traced step.
    A BaseException so that the user's `except Exception` does not swallow it."""


def _tensors(tree):
    return [leaf for leaf in pytree.tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def _has_exact_values(tensor: torch.Tensor) -> bool:
    """Integer and bool tensors: the ones whose real values a fake run keeps
    (indices, targets), in `StorageTracker.shadows`."""
    return not (tensor.dtype.is_floating_point or tensor.dtype.is_complex)


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0].strip() == "cuda"
    # A bare integer is a CUDA ordinal in .to(0) / device=0.
    return isinstance(device, int) and not isinstance(device, bool)


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


class Context:
    """Where the script is: phase (forward/backward/optimizer), module, line."""

    def __init__(self, user_dir: str):
        self.user_dir = user_dir + os.sep
        self.forward_depth = 0
        self.in_backward = 0
        self.in_optimizer = 0
        self.module_tracker = None

    @property
    def in_step(self) -> bool:
        return self.forward_depth > 0 or self.in_backward > 0 or self.in_optimizer > 0

    def module(self) -> str:
        if self.module_tracker is None:
            return ""
        parents = [name for name in self.module_tracker.parents if name != "Global"]
        return max(parents, key=lambda name: name.count(".")) if parents else ""

    def user_line(self) -> tuple[str, int] | None:
        frame = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if filename.startswith(self.user_dir) and filename != HARNESS_FILE:
                return filename, frame.f_lineno
            frame = frame.f_back
        return None

    def default_category(self) -> str:
        if self.in_optimizer:
            return "temporaries"
        if self.in_backward:
            return "temporaries"
        if self.forward_depth > 0:
            return "activations" if torch.is_grad_enabled() else "temporaries"
        return "other"


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
        self.registered = 0
        self.paused = 0
        self.device_scope = 0
        self.stubbed_scalars = 0
        # Fake integer/bool tensors computed outside the training step (token
        # arrays, random indices, their slices) keep a real twin, so that
        # `data[i : i + block]` reads real indices instead of a stubbed 0.
        self.shadows = None
        self.fake_tensor_type = None  # FakeTensor, under fake mode
        self.fake_memo: FakeDispatchMemo | None = None  # under fake mode
        self.op_counts = collections.Counter()

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
        self._count_peak(op)

    def _count_peak(self, op: str) -> None:
        # ">=": a later step that reaches the same peak has its optimizer
        # state categorised (the first step creates it as temporaries).
        if self.current >= self.peak:
            self.peak = self.current
            self.peak_info = {
                "op": op,
                "module": self.context.module(),
                "line": self.context.user_line(),
                "phase": self._phase(),
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

    def _phase(self) -> str:
        if self.context.in_optimizer:
            return "optimizer step"
        if self.context.in_backward:
            return "backward"
        if self.context.forward_depth:
            return "forward"
        return "outside the step"

    def _finalize(self, key: int) -> None:
        record = self.live.pop(key, None)
        if record is not None and record.counted:
            self._uncount(record)

    def register(
        self, tensor: torch.Tensor, device: bool, op: str, category: str | None = None, extra: int = 0
    ):
        """Registers `tensor`'s storage if new; returns its record."""
        if tensor.is_nested or tensor.layout != torch.strided:
            return None
        storage = tensor.untyped_storage()
        key = id(storage)
        record = self.live.get(key)
        if record is not None:
            return record
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
        record.category = category

    def is_device(self, tensor: torch.Tensor) -> bool:
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
        if func is PRIM_DEVICE and type(args[0]) is self.fake_tensor_type:
            # Half of a fake run's dispatches ask for a fake tensor's device
            # (the autograd engine, above all): FakeTensorMode's answer outside
            # its kernels, without going through its dispatch.
            if not args[0].fake_mode.in_kernel_invocation:
                return args[0].fake_device
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        if func is aten._local_scalar_dense.default:
            return self._local_scalar(func, args, kwargs)
        traits = _OP_TRAITS.get(func) or _op_traits(func)
        if self.fake_memo is not None:
            out = self.fake_memo.call(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
        self.op_counts[traits.packet] += 1
        outputs = _op_tensors((out,), [])
        if not outputs:
            return out  # a metadata query: nothing allocated
        inputs = None
        if self.shadows is not None and not self.context.in_step:
            inputs = _op_tensors(kwargs.values(), _op_tensors(args, []))
            self._shadow(func, args, kwargs, inputs, outputs)
        if traits.aliases:
            # Views and in-place ops allocate nothing. Checked by schema, not by
            # storage identity: a view of a real tensor, which fake mode converts,
            # reports a storage object of its own.
            return out
        device = self.device_scope > 0 or (self.context.in_step and not self.count_all)
        if not device:
            if inputs is None:
                inputs = _op_tensors(kwargs.values(), _op_tensors(args, []))
            device = any(self.is_device(t) for t in inputs)
        op = traits.name
        if func is aten.mkldnn_rnn_layer.default and "rnn_workspace" in self.kernel_models:
            extra = self.kernel_models["rnn_workspace"](self, args, outputs)
            for tensor in outputs[:-1]:
                self.register(tensor, device, op)
            self.register(outputs[-1], device, op, extra=extra)
            return out
        for tensor in outputs:
            self.register(tensor, device, op)
        if func in CONVOLUTIONS and "conv_scratch" in self.kernel_models:
            self._transient(self.kernel_models["conv_scratch"](self, func, args), op)
        return out

    def _transient(self, size: int, op: str) -> None:
        """Memory a kernel allocates and frees inside itself: a peak candidate only."""
        if size <= 0 or self.current + size < self.peak:
            return
        self.by_category["temporaries"] += size
        self.by_module[self.context.module()] += size
        self.current += size
        self._count_peak(op)
        self.current -= size
        self.by_category["temporaries"] -= size
        self.by_module[self.context.module()] -= size

    def _shadow(self, func, args, kwargs, inputs, outputs):
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

        if not outputs or not all(_has_exact_values(t) for t in outputs):
            return
        if sum(t.numel() for t in outputs) > SHADOW_NUMEL_LIMIT:
            return
        real = {}
        for tensor in inputs:
            twin = self.shadows.get(tensor) if isinstance(tensor, FakeTensor) else tensor
            if twin is None:
                return
            real[id(tensor)] = twin

        def to_real(value):
            # An aten op's arguments: tensors, and lists and tuples of them (as _op_tensors walks them).
            if isinstance(value, torch.Tensor):
                return real[id(value)]
            if type(value) is list or type(value) is tuple:
                return type(value)(to_real(item) for item in value)
            return value

        self.paused += 1
        try:
            with unset_fake_temporarily():
                real_out = func(*map(to_real, args), **{name: to_real(value) for name, value in kwargs.items()})
        finally:
            self.paused -= 1
        for fake, twin in zip(outputs, _op_tensors((real_out,), [])):
            self.shadows[fake] = twin

    def _local_scalar(self, func, args, kwargs):
        from torch._subclasses.fake_tensor import DataDependentOutputException

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
            # `.item()` / `bool(t)` on a value only a real run knows: answer a
            # neutral value; a data-dependent branch then goes one way.
            self.stubbed_scalars += 1
            dtype = args[0].dtype
            if dtype == torch.bool:
                return False
            if dtype.is_floating_point or dtype.is_complex:
                return 0.0
            return 0


class OpTraits:
    """What the tracker reads of an operator on each call, worked out once."""

    __slots__ = ("aliases", "name", "packet")

    def __init__(self, func):
        self.name = f"aten.{func.__name__ if hasattr(func, '__name__') else func}"
        self.packet = func.overloadpacket.__name__
        self.aliases = any(ret.alias_info is not None for ret in func._schema.returns)


_OP_TRAITS: dict = {}


def _op_traits(func) -> OpTraits:
    traits = _OP_TRAITS[func] = OpTraits(func)
    return traits


def _op_tensors(values, found: list) -> list:
    """Appends the tensors among an aten op's arguments or results to `found`:
    at the dispatcher those are tensors and (nested) lists and tuples of them,
    walked here in pytree's order, for a fraction of a pytree walk's cost."""
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            _op_tensors(value, found)
    return found


class FakeDispatchMemo:
    """Answers an op on fake tensors from the outputs of an earlier call with
    the same metadata, in place of FakeTensorMode's own dispatch cache.

    FakeTensorMode's cache builds a generic key (17 fields of every tensor
    argument, walked through dataclasses and pytrees) and an entry on every
    first call; on a small model that costs more than the ops. This memo
    keys a call by a tuple read straight off the arguments (the fields
    FakeTensorMode's key holds, and its global state but proxy tracing, which
    a run never does: torch.compile is shimmed to eager; the arguments'
    storage offsets only for ops that may alias, see _memo_kind), records
    where each output came from (an argument returned as is, a view of an
    argument's storage, a fresh storage) and replays that. It learns a call only when
    the replay gives back exactly what FakeTensorMode gave (shape, strides,
    offset, storage, dtype, device, dispatch keys), the call left its
    arguments' metadata unchanged and no two outputs share a storage; ops
    FakeTensorMode itself never caches (data-dependent, dynamic shapes,
    metadata-mutating views, lifts) and calls with constants, real tensors or
    opaque arguments go to FakeTensorMode every time. FakeTensorMode's cache
    is switched off for the run: the calls the memo passes on are the ones
    it would not cache, or those that run once."""

    NOT_MEMOISED = object()
    # Argument values that are their own key (with their type: 1 and 1.0 hash
    # alike but give different dtypes).
    PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)
    SMALL_INDEX_DTYPES = (torch.bool, torch.int8, torch.uint8)  # index with these is a mask: data-dependent

    def __init__(self, fake_mode, entries: dict | None = None):
        from torch._subclasses import fake_tensor

        self.fake_mode = fake_mode
        self.fake_tensor_type = fake_tensor.FakeTensor
        self.entries = _FAKE_MEMO_ENTRIES if entries is None else entries
        self.hits = 0
        fake_mode.cache_enabled = False

    def call(self, func, args, kwargs):
        if func in _INDEXED_VIEWS and not kwargs and self._indexable(args):
            return self._indexed_view(func, args)
        kind = _MEMO_KINDS.get(func)
        if kind is None:
            kind = _MEMO_KINDS[func] = self._memo_kind(func)
        if kind is NOT_MEMOISABLE:
            return func(*args, **kwargs)
        tensors: list = []
        key = self._key(func, args, kwargs, tensors, kind is ALIASING)
        if key is None or (func is INDEX_TENSOR and any(t.dtype in self.SMALL_INDEX_DTYPES for t in tensors[1:])):
            return func(*args, **kwargs)
        entry = self.entries.get(key)
        if entry is None:
            return self._learn(key, func, args, kwargs, tensors, kind is ALIASING)
        if entry is self.NOT_MEMOISED:
            return func(*args, **kwargs)
        self.hits += 1
        return self._replay(entry, tensors)

    def _indexable(self, args) -> bool:
        return self._ours(args[0]) and all(type(value) is int or value is None for value in args[1:])

    def _indexed_view(self, func, args):
        """`data[i : i + block]`, `x[i]` with indices read from the data: a new
        memo key for every index, so computed instead, by the view kernel itself
        (views are metadata arithmetic, the same code on every device) on a meta
        tensor laid over the fake tensor's storage, as a memo replay is."""
        source = args[0]
        with torch._C._DisableTorchDispatch():
            twin = torch.empty((0,), dtype=source.dtype, device="meta").set_(
                source.untyped_storage(), source.storage_offset(), source.shape, source.stride()
            )
            view = func(twin, *args[1:])
        self.hits += 1
        return self.fake_tensor_type(self.fake_mode, view, source.fake_device)

    @staticmethod
    def _memo_kind(func):
        """NOT_MEMOISABLE; ALIASING, an op whose outputs may be laid over an
        argument's storage at an offset of its choosing (a view, as_strided),
        keyed by its arguments' storage offsets; or FRESH, any other op, whose
        outputs do not depend on where its arguments start in their storage
        (an op on `x[t]` for every t is one key, not one per t)."""
        if not isinstance(func, torch._ops.OpOverload) or func.namespace not in ("aten", "prims"):
            return NOT_MEMOISABLE
        tags = func.tags
        if torch.Tag.data_dependent_output in tags or torch.Tag.inplace_view in tags:
            return NOT_MEMOISABLE
        if torch.Tag.dynamic_output_shape in tags and func is not INDEX_TENSOR:
            return NOT_MEMOISABLE
        if func in (aten.lift_fresh.default, aten.lift_fresh_copy.default, aten._local_scalar_dense.default):
            return NOT_MEMOISABLE
        schema = func._schema
        if any(ret.alias_info is not None for ret in schema.returns) or any(
            argument.name == "storage_offset" for argument in schema.arguments
        ):
            return ALIASING
        return FRESH

    def _learn(self, key, func, args, kwargs, tensors, with_offsets):
        out = func(*args, **kwargs)
        entry = self._entry(func, out, tensors)
        if entry is not None and self._key(func, args, kwargs, [], with_offsets) != key:
            entry = None  # the op changed an argument's shape, strides or storage: not a replayable answer
        if entry is not None and not self._same(out, self._replay(entry, tensors)):
            entry = None
        self.entries[key] = self.NOT_MEMOISED if entry is None else entry
        return out

    def _entry(self, func, out, tensors):
        """(output container type or None, one spec per output), or None when
        an output is not a plain fake tensor of this mode."""
        sequence = type(out) if type(out) in (tuple, list) else None
        specs = []
        storages = {id(tensor.untyped_storage()): index for index, tensor in enumerate(tensors)}
        fresh: set = set()
        for value in out if sequence else (out,):
            if value is None and sequence:
                specs.append(None)
                continue
            if not self._plain_fake(value):
                return None
            argument = next((index for index, tensor in enumerate(tensors) if tensor is value), None)
            if argument is not None:
                specs.append(argument)  # in place, or out=: the argument itself
                continue
            storage = id(value.untyped_storage())
            source = storages.get(storage)  # a view (or _unsafe_view, which aliases without saying so)
            if source is None:
                if func.is_view or storage in fresh or value.storage_offset() != 0:
                    return None
                fresh.add(storage)
            # Over an argument's storage, the offset is kept relative to the argument's own.
            offset = value.storage_offset() - (tensors[source].storage_offset() if source is not None else 0)
            specs.append(
                (source, tuple(value.shape), value.stride(), offset, value.dtype, value.fake_device, value.requires_grad)
            )
        return sequence, tuple(specs)

    def _ours(self, value) -> bool:
        """A strided fake tensor of this run's mode, without a constant."""
        return (
            type(value) is self.fake_tensor_type
            and value.fake_mode is self.fake_mode
            and value.constant is None
            and value.layout is torch.strided
        )

    def _plain_fake(self, value) -> bool:
        return self._ours(value) and not value.is_conj() and not value.is_neg()

    def _replay(self, entry, tensors):
        sequence, specs = entry
        outputs = []
        for spec in specs:
            if spec is None or type(spec) is int:
                outputs.append(None if spec is None else tensors[spec])
                continue
            source, shape, stride, offset, dtype, device, requires_grad = spec
            # A plain meta tensor, wrapped below as FakeTensorMode wraps its kernels' outputs.
            with torch._C._DisableTorchDispatch():
                meta = torch.empty_strided(shape, stride, dtype=dtype, device="meta", requires_grad=requires_grad)
                if source is not None:
                    base = tensors[source]
                    meta.set_(base.untyped_storage(), base.storage_offset() + offset, shape, stride)
            outputs.append(self.fake_tensor_type(self.fake_mode, meta, device))
        return sequence(outputs) if sequence else outputs[0]

    def _same(self, out, replayed) -> bool:
        sequence = type(out) if type(out) in (tuple, list) else None
        if type(replayed) is not type(out):
            return False
        pairs = zip(out, replayed) if sequence else ((out, replayed),)
        for real, again in pairs:
            if real is None or again is None:
                if real is not again:
                    return False
                continue
            if real is again:
                continue
            if (
                real.shape != again.shape
                or real.stride() != again.stride()
                or real.storage_offset() != again.storage_offset()
                or real.dtype != again.dtype
                or real.fake_device != again.fake_device
                or real.requires_grad != again.requires_grad
                or real.untyped_storage().nbytes() != again.untyped_storage().nbytes()
                or torch._C._dispatch_key_set(real) != torch._C._dispatch_key_set(again)
            ):
                return False
        return True

    def _key(self, func, args, kwargs, tensors, with_offsets: bool):
        parts = [
            func,
            torch.get_default_dtype(),
            torch._C._get_default_device(),
            torch.is_inference_mode_enabled(),
        ]
        if not self._add_values(args, parts, tensors, with_offsets):
            return None
        for name, value in kwargs.items():
            parts.append(name)
            if not self._add_values((value,), parts, tensors, with_offsets):
                return None
        return tuple(parts)

    def _add_values(self, values, parts, tensors, with_offsets: bool) -> bool:
        for value in values:
            kind = type(value)
            if kind is self.fake_tensor_type:
                if not self._ours(value):
                    return False
                tensors.append(value)
                parts.append(
                    (
                        value.shape,
                        value.stride(),
                        value.storage_offset() if with_offsets else None,
                        value.untyped_storage().nbytes(),
                        value.dtype,
                        value.fake_device,
                        value.requires_grad,
                        value.is_conj(),
                        value.is_neg(),
                        value.is_inference(),
                    )
                )
            elif kind is list or kind is tuple:
                parts.append(kind)
                parts.append(len(value))
                if not self._add_values(value, parts, tensors, with_offsets):
                    return False
            elif kind in self.PLAIN:
                parts.append(kind)
                parts.append(value)
            else:
                return False  # a real tensor, a SymInt, a generator, a storage: FakeTensorMode decides
        return True


INDEX_TENSOR = aten.index.Tensor
NOT_MEMOISABLE, ALIASING, FRESH = "not memoisable", "aliasing", "fresh"
# Views whose integer arguments are often indices read from the data.
_INDEXED_VIEWS = (aten.slice.Tensor, aten.select.int)
_MEMO_KINDS: dict = {}  # OpOverload -> NOT_MEMOISABLE, ALIASING or FRESH
_FAKE_MEMO_ENTRIES: dict = {}  # kept for the interpreter's life, as FakeTensorMode's own cache is


# What CudaRedirect rewrites, besides any call with a `device` argument. A
# tuple: `in` compares by identity first, and needs no hashable `func`.
_REDIRECTED = (
    torch.Tensor.cuda,
    torch.Tensor.to,
    torch.Tensor.pin_memory,
    torch.Tensor.is_pinned,
)


class CudaRedirect(TorchFunctionMode):
    """The script asks for `cuda`; it gets the CPU, and the tracker learns that
    the result lives on the GPU."""

    def __init__(self, tracker: StorageTracker):
        super().__init__()
        self.tracker = tracker

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func not in _REDIRECTED and not (kwargs and "device" in kwargs):
            # Every torch call and tensor attribute read comes through here.
            return func(*args, **(kwargs or {}))
        kwargs = dict(kwargs or {})
        wants_device = False
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
            wants_device = True
        if func is torch.Tensor.cuda:
            func, args, kwargs = (
                torch.Tensor.to,
                (args[0], "cpu"),
                {"non_blocking": kwargs.get("non_blocking", False)},
            )
            wants_device = True
        elif (
            func is torch.Tensor.to and len(args) > 1 and not isinstance(args[1], (torch.Tensor, torch.dtype))
        ):
            if _is_cuda(args[1]):
                args = (args[0], "cpu", *args[2:])
                wants_device = True
        elif func is torch.Tensor.pin_memory:
            return args[0]
        elif func is torch.Tensor.is_pinned:
            return False
        if not wants_device:
            return func(*args, **kwargs)
        self.tracker.device_scope += 1
        try:
            out = func(*args, **kwargs)
        finally:
            self.tracker.device_scope -= 1
        for tensor in _tensors(out):
            self.tracker.mark_device(tensor, f"{getattr(func, '__name__', 'to')}(cuda)")
        return out


# --- CUDA kernel emulation -------------------------------------------------------


def make_sdpa_route(notes: dict):
    """F.scaled_dot_product_attention as CUDA would run it: flash attention for
    fp16/bf16 without a mask, memory-efficient attention otherwise (a mask
    becomes its additive bias; a boolean one is converted to a float bias
    first, as CUDA does); both keep only the output and a logsumexp, where the
    CPU math path keeps B x H x L x S scores. Grouped-query attention keeps the
    math path."""

    def route(
        query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False
    ):
        if enable_gqa or query.dim() != 4 or key.shape[-3] != query.shape[-3]:
            notes["sdpa_math_kept"] = notes.get("sdpa_math_kept", 0) + 1
            return None
        head_dim = query.shape[-1]
        flash_dtype = query.dtype in (torch.float16, torch.bfloat16)
        if attn_mask is None and flash_dtype and head_dim % 8 == 0 and head_dim <= 256:
            out = aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale
            )
            notes["sdpa_flash"] = notes.get("sdpa_flash", 0) + 1
            return out[0]
        bias = None
        if attn_mask is not None:
            if attn_mask.dtype == torch.bool:
                attn_mask = torch.zeros(attn_mask.shape, dtype=query.dtype).masked_fill(
                    attn_mask.logical_not(), float("-inf")
                )
            batch, heads, length = query.shape[:3]
            bias = attn_mask.expand(batch, heads, length, key.shape[-2])
        needs_lse = torch.is_grad_enabled() and any(t.requires_grad for t in (query, key, value))
        out = aten._scaled_dot_product_efficient_attention(
            query, key, value, bias, needs_lse, dropout_p, is_causal, scale=scale
        )
        notes["sdpa_mem_efficient"] = notes.get("sdpa_mem_efficient", 0) + 1
        return out[0]

    return route


def install_sdpa_route(shims, route) -> None:
    """Routes F.scaled_dot_product_attention by replacing the module's
    attribute, not in CudaRedirect: nn.MultiheadAttention (and so
    nn.TransformerEncoder) calls it from inside F.multi_head_attention_forward,
    itself a torch function, whose inner calls a TorchFunctionMode never sees."""
    original = torch.nn.functional.scaled_dot_product_attention

    def scaled_dot_product_attention(*args, **kwargs):
        routed = route(*args, **kwargs)
        return original(*args, **kwargs) if routed is None else routed

    shims.patch(torch.nn.functional, "scaled_dot_product_attention", scaled_dot_product_attention)


CONVOLUTIONS = (aten.convolution.default, aten.convolution_backward.default)

# Probes of real kernels, kept for the interpreter's life: a kernel's scratch
# or workspace depends on its configuration (and thread count), not on the run,
# and a batch-size search traces the same script several times.
_CONV_SCRATCH_PROBES: dict[tuple, tuple[int, int]] = {}
_RNN_WORKSPACE_PROBES: dict[tuple, int] = {}


def make_conv_scratch(notes: dict):
    """oneDNN's convolution scratch (reordered copies of the input, output,
    gradients), allocated and freed inside the kernel, so no dispatcher-level
    tracker sees it. Measured on the real kernel: each distinct convolution is
    run on zeros at batch sizes 2 and 4 under the profiler (after a warm-up
    call: the first call caches weight layouts), and the transient bytes above
    the outputs are extrapolated linearly in the batch size."""
    cache = _CONV_SCRATCH_PROBES
    used: set[tuple] = set()

    def zeros_like_args(args, batch, batch_positions):
        return [
            torch.zeros((batch, *a.shape[1:]) if index in batch_positions else a.shape, dtype=a.dtype)
            if isinstance(a, torch.Tensor)
            else a
            for index, a in enumerate(args)
        ]

    def measure(func, args, batch, batch_positions):
        from torch.profiler import ProfilerActivity, profile

        real_args = zeros_like_args(args, batch, batch_positions)
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            outputs = func(*real_args)
        del outputs
        peak, current = _replay_allocations(prof)
        return peak - max(current, 0)

    def scratch(tracker, func, args):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        batch_positions = (0,) if func is aten.convolution.default else (0, 1)
        batch = args[0].shape[0]
        key = (
            func,
            tuple(tuple(a.shape[1:]) if isinstance(a, torch.Tensor) else a for a in args[:2]),
            tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else str(a) for a in args[2:]),
            args[0].dtype,
            torch.get_num_threads(),
        )
        if key not in cache:
            tracker.paused += 1
            try:
                with unset_fake_temporarily(), torch.no_grad():
                    func(*zeros_like_args(args, 2, batch_positions))
                    cache[key] = (
                        measure(func, args, 2, batch_positions),
                        measure(func, args, 4, batch_positions),
                    )
            finally:
                tracker.paused -= 1
        at_2, at_4 = cache[key]
        size = max(0, int(at_2 + (at_4 - at_2) / 2 * (batch - 2)))
        used.add(key)
        notes["probes"] = len(used)
        notes["bytes"] = max(notes.get("bytes", 0), size)
        return size

    return scratch


def make_rnn_workspace(kind: str, notes: dict):
    """The RNN workspace that the meta kernel reports as 0 bytes.

    "onednn": the real oneDNN LSTM layer is run on zeros: at the real sequence
    length up to 32 steps, else at 16 and 32 steps and extrapolated (the
    workspace grows by a page-rounded size per step, so short probes
    under-estimate the slope).
    "cudnn": cuDNN's training reserve space, modelled as the per-timestep gate
    activations, cell and hidden states (6 x hidden per element, not yet
    calibrated on a GPU)."""
    cache = _RNN_WORKSPACE_PROBES

    def probe(args, seq_dim, length):
        shape = list(args[0].shape)
        shape[seq_dim] = length
        real_args = [
            torch.zeros(shape, dtype=a.dtype, requires_grad=True)
            if index == 0
            else torch.zeros(a.shape, dtype=a.dtype, requires_grad=a.dtype.is_floating_point)
            if isinstance(a, torch.Tensor)
            else a
            for index, a in enumerate(args)
        ]
        return aten.mkldnn_rnn_layer.default(*real_args)[3].untyped_storage().nbytes()

    def onednn(tracker, args, outputs):
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        seq_dim = 1 if args[14] else 0  # batch_first
        seq = args[0].shape[seq_dim]
        key = (
            tuple(args[0].shape),
            tuple(outputs[1].shape),
            args[0].dtype,
            tuple(str(a) for a in args[7:]),
            torch.get_num_threads(),
        )
        if key not in cache:
            tracker.paused += 1  # the probe's real tensors are not the script's
            try:
                # The workspace exists only when autograd will need it.
                with unset_fake_temporarily(), torch.enable_grad():
                    if seq <= 32:
                        cache[key] = probe(args, seq_dim, seq)
                    else:
                        at_16, at_32 = probe(args, seq_dim, 16), probe(args, seq_dim, 32)
                        cache[key] = at_32 + (at_32 - at_16) * (seq - 32) // 16
            finally:
                tracker.paused -= 1
        notes["bytes"] = max(notes.get("bytes", 0), cache[key])
        notes["calls"] = notes.get("calls", 0) + 1
        return cache[key]

    def cudnn(tracker, args, outputs):
        inp = args[0]
        seq, batch, _ = inp.shape
        hidden = outputs[1].shape[-1]
        reserve = 6 * seq * batch * hidden * inp.element_size()
        notes["bytes"] = max(notes.get("bytes", 0), reserve)
        notes["calls"] = notes.get("calls", 0) + 1
        return reserve

    return onednn if kind == "onednn" else cudnn


# --- Shims -----------------------------------------------------------------------


class Shims:
    """Everything patched around the script, restored by `undo()`."""

    def __init__(self):
        self._undo: list = []

    def patch(self, owner, name, value):
        original = getattr(owner, name)
        setattr(owner, name, value)
        self._undo.append((owner, name, original))
        return original

    def undo(self):
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)


def fake_apply(self, fn, recurse=True):
    """nn.Module._apply for modules built under fake mode: torch's version
    fails to swap fake parameters ("Couldn't swap Linear.weight")."""
    if recurse:
        for module in self.children():
            module._apply(fn)
    for key, param in self._parameters.items():
        if param is None:
            continue
        with torch.no_grad():
            applied = fn(param)
        if applied is not param:
            new = nn.Parameter(applied, param.requires_grad)
            if param.grad is not None:
                new.grad = fn(param.grad)
            self._parameters[key] = new
    for key, buffer in self._buffers.items():
        if buffer is not None:
            self._buffers[key] = fn(buffer)
    return self


class CudaEvent:
    """torch.cuda.Event for timing code: records nothing, measures 0 ms."""

    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


class FakeCudaProperties:
    def __init__(self, name, total_memory):
        self.name = name
        self.total_memory = total_memory
        self.major, self.minor = 9, 0
        self.multi_processor_count = 132


def install_shims(shims: Shims, request: dict, tracker: StorageTracker, context: Context, state: dict):
    fake_mode = state.get("fake_mode")
    batch_override = request.get("batch_size")
    gpu_name = request.get("gpu_name") or "oom-lsp estimated GPU"
    gpu_memory = request.get("gpu_memory") or 80 * 2**30

    # torch.cuda: the script takes its GPU path.
    cuda = torch.cuda
    shims.patch(cuda, "is_available", lambda: True)
    shims.patch(cuda, "device_count", lambda: 1)
    shims.patch(cuda, "current_device", lambda: 0)
    shims.patch(cuda, "set_device", lambda device: None)
    shims.patch(cuda, "synchronize", lambda device=None: None)
    shims.patch(cuda, "empty_cache", lambda: None)
    shims.patch(cuda, "manual_seed", lambda seed: None)
    shims.patch(cuda, "manual_seed_all", lambda seed: None)
    shims.patch(cuda, "get_device_name", lambda device=None: gpu_name)
    shims.patch(cuda, "get_device_capability", lambda device=None: (9, 0))
    shims.patch(cuda, "get_device_properties", lambda device=None: FakeCudaProperties(gpu_name, gpu_memory))
    shims.patch(cuda, "is_bf16_supported", lambda *a, **k: True)
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        shims.patch(cuda, name, lambda device=None: 0)
    for name in ("reset_peak_memory_stats", "reset_max_memory_allocated"):
        shims.patch(cuda, name, lambda device=None: None)
    shims.patch(cuda, "mem_get_info", lambda device=None: (gpu_memory, gpu_memory))
    shims.patch(cuda, "set_per_process_memory_fraction", lambda fraction, device=None: None)
    shims.patch(cuda, "memory_summary", lambda *a, **k: "")
    shims.patch(cuda, "Event", CudaEvent)
    shims.patch(torch, "save", lambda *a, **k: None)

    # torch.compile: traced eagerly (fake tensors through dynamo are out of
    # scope); fused kernels keep fewer intermediates, so this over-estimates.
    def compile_eagerly(model=None, **kwargs):
        state["compiled"] = state.get("compiled", 0) + 1
        if model is None:
            return lambda fn: fn
        return model

    shims.patch(torch, "compile", compile_eagerly)

    # autocast("cuda", dtype) -> autocast("cpu", same dtype); CUDA's default is fp16.
    autocast_cls = torch.amp.autocast_mode.autocast
    original_autocast_init = autocast_cls.__init__

    def autocast_init(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        if device_type == "cuda":
            dtype = dtype or torch.float16
            device_type = "cpu"
            if enabled:
                state["autocast_regions"] = state.get("autocast_regions", 0) + 1
                state.setdefault("autocast_dtypes", set()).add(str(dtype).replace("torch.", ""))
        original_autocast_init(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    shims.patch(autocast_cls, "__init__", autocast_init)
    scaler_cls = torch.amp.GradScaler
    original_scaler_init = scaler_cls.__init__

    def scaler_init(self, device="cuda", *args, **kwargs):
        original_scaler_init(self, "cpu" if _is_cuda(device) else device, *args, **kwargs)

    shims.patch(scaler_cls, "__init__", scaler_init)
    if hasattr(torch.cuda.amp, "GradScaler"):
        shims.patch(
            torch.cuda.amp.GradScaler, "__init__", lambda self, *a, **k: scaler_init(self, "cpu", *a, **k)
        )

    # Module.cuda()/to("cuda") reach Tensor.to through CudaRedirect; under
    # fake mode parameters must be re-registered rather than swapped.
    if fake_mode is not None:
        shims.patch(nn.Module, "_apply", fake_apply)

    # Parameters and buffers are categorised when they are registered.
    original_register_parameter = nn.Module.register_parameter

    def register_parameter(self, name, param):
        original_register_parameter(self, name, param)
        if param is not None:
            tracker.set_category(param, "parameters")

    shims.patch(nn.Module, "register_parameter", register_parameter)
    original_register_buffer = nn.Module.register_buffer

    def register_buffer(self, name, tensor, persistent=True):
        original_register_buffer(self, name, tensor, persistent)
        if tensor is not None:
            tracker.set_category(tensor, "parameters")

    shims.patch(nn.Module, "register_buffer", register_buffer)

    # Forward phase: global module hooks.
    def forward_pre(module, inputs):
        context.forward_depth += 1

    def forward_post(module, inputs, output):
        context.forward_depth -= 1

    state["hooks"] = [
        nn.modules.module.register_module_forward_pre_hook(forward_pre),
        nn.modules.module.register_module_forward_hook(forward_post, always_call=True),
    ]

    # Backward phase.
    original_backward = torch.autograd.backward

    def backward(*args, **kwargs):
        context.in_backward += 1
        try:
            return original_backward(*args, **kwargs)
        finally:
            context.in_backward -= 1

    shims.patch(torch.autograd, "backward", backward)

    # Optimizer: parameters, gradients, state; CUDA's foreach default; stop after N steps.
    import torch.optim.optimizer as optimizer_module

    original_add_param_group = torch.optim.Optimizer.add_param_group

    def add_param_group(self, param_group):
        original_add_param_group(self, param_group)
        for param in self.param_groups[-1]["params"]:
            tracker.set_category(param, "parameters")
            if param.requires_grad and id(param) not in state["grad_hooked"]:
                state["grad_hooked"].add(id(param))
                param.register_post_accumulate_grad_hook(lambda p: tracker.set_category(p.grad, "gradients"))

    state["grad_hooked"] = set()
    shims.patch(torch.optim.Optimizer, "add_param_group", add_param_group)

    if request.get("cuda_foreach"):
        # CUDA parameters default to the foreach implementation; CPU and fake
        # parameters silently get the per-tensor loop.
        def default_to_fused_or_foreach(params, differentiable, use_fused=False):
            if differentiable:
                return False, False
            state["foreach_pinned"] = True
            return use_fused, not use_fused

        for module in list(sys.modules.values()):
            name = getattr(module, "__name__", "")
            if name.startswith("torch.optim") and hasattr(module, "_default_to_fused_or_foreach"):
                shims.patch(module, "_default_to_fused_or_foreach", default_to_fused_or_foreach)

    def step_pre(optimizer, args, kwargs):
        context.in_optimizer += 1

    def step_post(optimizer, args, kwargs):
        context.in_optimizer -= 1
        for param_state in optimizer.state.values():
            for value in param_state.values():
                if isinstance(value, torch.Tensor):
                    tracker.set_category(value, "optimizer_state")
        state["steps"] += 1
        state["step_ends"].append(time.perf_counter())
        _emit("step", step=state["steps"])
        if state["steps"] >= request.get("steps", 2):
            raise StopEstimate()

    state["steps"] = 0
    state["step_ends"] = []
    state["hooks"] += [
        optimizer_module.register_optimizer_step_pre_hook(step_pre),
        optimizer_module.register_optimizer_step_post_hook(step_post),
    ]

    # DataLoader: in-process, unpinned, the batch size overridden; under fake
    # mode one real batch is fetched outside it (a TensorDataset's is made from
    # its shapes) and replayed as fake tensors.
    from torch.utils.data import DataLoader

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
            _add_knob(state, context, "DataLoader(batch_size=...)")
            if state.get("loader_batch") is None:
                state["loader_batch"] = batch_size
        original_loader_init(self, dataset, batch_size, *args, **kwargs)
        _record_loader(state, context, self)

    shims.patch(DataLoader, "__init__", loader_init)

    if fake_mode is not None:
        from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
        from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler, TensorDataset
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
                None if isinstance(leaf, FakeTensor) or not _has_exact_values(leaf) else leaf
                for leaf in _tensors(batch)
            ]
            return batch, twins

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
                        exact = known is not None and _has_exact_values(tensor)
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
            wanted = self.batch_size
            got = (
                _tensors(real_batch)[0].shape[0]
                if _tensors(real_batch) and _tensors(real_batch)[0].dim()
                else None
            )

            def to_fake(leaf):
                if not isinstance(leaf, torch.Tensor):
                    return leaf
                if wanted and got and got < wanted and leaf.dim() and leaf.shape[0] == got:
                    # A dataset smaller than the batch (a sample file, a larger
                    # --batch-size): the batch the real data would give.
                    tracker.paused += 1
                    try:
                        return torch.empty((wanted, *leaf.shape[1:]), dtype=leaf.dtype)
                    finally:
                        tracker.paused -= 1
                return fake_mode.from_tensor(leaf)

            if wanted and got and got < wanted:
                state["batch_padded"] = [got, wanted]
            for _ in range(max(1, len(self)) if hasattr(self.dataset, "__len__") else 1_000_000):
                batch = pytree.tree_map(to_fake, real_batch)
                for fake, twin in zip(_tensors(batch), twins):
                    tracker.register(fake, False, "DataLoader", "inputs")
                    if twin is not None and fake.shape == twin.shape:
                        tracker.shadows[fake] = twin
                yield batch

        shims.patch(DataLoader, "__iter__", loader_iter)

    # argparse: the batch-size option's parsed value is read, and replaced by
    # the override (whatever the command line said).
    original_add_argument = argparse._ActionsContainer.add_argument

    def add_argument(self, *args, **kwargs):
        action = original_add_argument(self, *args, **kwargs)
        names = {arg.lstrip("-").replace("-", "_") for arg in args if isinstance(arg, str)} | {action.dest}
        if names & BATCH_OPTION_NAMES:
            _add_knob(state, context, f"argparse {args[0] if args else action.dest}")
            state["batch_dests"].add(action.dest)
        return action

    original_parse_known_args = argparse.ArgumentParser.parse_known_args

    def parse_known_args(self, args=None, namespace=None):
        parsed, extras = original_parse_known_args(self, args, namespace)
        for dest in state["batch_dests"]:
            if hasattr(parsed, dest):
                if batch_override is not None:
                    setattr(parsed, dest, batch_override)
                    state["override_applied"].append(f"argparse {dest}")
                if isinstance(getattr(parsed, dest), int):
                    state["argparse_batch"] = getattr(parsed, dest)
        return parsed, extras

    state["override_applied"] = []
    state["loaders"] = []
    state["batch_knobs"] = {}
    state["batch_dests"] = set()
    shims.patch(argparse._ActionsContainer, "add_argument", add_argument)
    shims.patch(argparse.ArgumentParser, "parse_known_args", parse_known_args)


def _record_loader(state: dict, context: Context, loader) -> None:
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


def _add_knob(state: dict, context: Context, kind: str) -> None:
    """Where the script sets its batch size: what the editor decorates."""
    where = context.user_line()
    key = (kind, where)
    if key not in state["batch_knobs"]:
        state["batch_knobs"][key] = {
            "kind": kind,
            "file": where[0] if where else None,
            "line": where[1] if where else None,
        }


# --- Running -----------------------------------------------------------------------


def _user_frames(tb, script_dir: str) -> list[dict]:
    """The traceback's frames in the user's files (not runpy's, torch's or
    ours), outermost first."""
    frames = []
    for frame, lineno in traceback.walk_tb(tb):
        filename = frame.f_code.co_filename
        if filename.startswith(script_dir + os.sep) and filename != HARNESS_FILE:
            frames.append(
                {
                    "file": filename,
                    "line": lineno,
                    "function": frame.f_code.co_name,
                    "code": _source_line(filename, lineno),
                }
            )
    return frames


def _source_line(filename: str, lineno: int) -> str:
    try:
        with open(filename, encoding="utf-8") as handle:
            for number, text in enumerate(handle, 1):
                if number == lineno:
                    return text.strip()
    except OSError:
        return ""
    return ""


_NO_FAKE_KERNEL = (
    "no fake impl",
    "'Meta' backend",
    "meta kernel",
    "meta function",
    "FakeTensor",
    "fake tensor",
)


def classify_failure(error: BaseException) -> str:
    """ "data-dependent" and "unsupported-operator" are what fake tensors cannot
    run (the estimate falls back to real CPU steps); anything else is the script's."""
    from torch._subclasses import fake_tensor

    if isinstance(error, (fake_tensor.DynamicOutputShapeException, fake_tensor.DataDependentOutputException)):
        return "data-dependent"
    if isinstance(error, fake_tensor.UnsupportedOperatorException):
        return "unsupported-operator"
    if isinstance(error, (RuntimeError, NotImplementedError)) and any(
        marker.lower() in str(error).lower() for marker in _NO_FAKE_KERNEL
    ):
        return "unsupported-operator"
    return "script-error"


def _replay_allocations(prof) -> tuple[int, int]:
    """(peak, final) of the running sum of the profiler's allocation events
    in time order: every c10 CPU allocation, kernel scratch included."""
    events = sorted(
        (event.start_ns(), index, event.nbytes())
        for index, event in enumerate(prof.profiler.kineto_results.events())
        if event.name() == "[memory]"
    )
    current = peak = 0
    for _, _, size in events:
        current += size
        peak = max(peak, current)
    return peak, current


def profile_replay_peak(prof) -> int:
    """Peak of the running sum of the profiler's allocation events."""
    return _replay_allocations(prof)[0]


def run(request: dict) -> dict:
    script = os.path.abspath(request["script"])
    script_dir = os.path.dirname(script)
    mode = request.get("mode", "fake")
    cuda = request.get("device", "cuda") == "cuda"
    torch.set_num_threads(max(1, int(request.get("threads", 1))))
    context = Context(script_dir)
    sdpa_notes: dict = {}
    rnn_notes: dict = {}
    models: dict = {}
    conv_notes: dict = {}
    # Real tensors already carry their real workspaces: models only under fake mode.
    if mode == "fake":
        models["rnn_workspace"] = make_rnn_workspace("cudnn" if cuda else "onednn", rnn_notes)
        if not cuda:
            models["conv_scratch"] = make_conv_scratch(conv_notes)
    tracker = StorageTracker(context, count_all=not cuda, round_cuda=cuda, kernel_models=models)
    state: dict = {}
    shims = Shims()
    result: dict = {"mode": mode, "device": "cuda" if cuda else "cpu", "torch": torch.__version__}

    fake_mode = None
    if mode == "fake":
        from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
        from torch.utils.weak import WeakIdKeyDictionary

        fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        # copy.deepcopy of a fake tensor (nn.TransformerEncoder copies its
        # layer, an EMA model its model) deep-copies its __dict__, fake_mode
        # included: the copy would belong to a mode of its own, a foreign
        # tensor that this mode converts afresh in every op that reads it.
        fake_mode.__deepcopy__ = lambda memo: fake_mode
        state["fake_mode"] = fake_mode
        tracker.shadows = WeakIdKeyDictionary()
        tracker.fake_tensor_type = FakeTensor
        # How fake dispatches are cached: "memo" (FakeDispatchMemo), "fake-tensor-mode"
        # (FakeTensorMode's own cache) or "none"; the last two for comparisons.
        fake_cache = request.get("fake_cache", "memo")
        if fake_cache == "memo":
            tracker.fake_memo = FakeDispatchMemo(fake_mode)
        elif fake_cache == "none":
            fake_mode.cache_enabled = False
    request = dict(request, cuda_foreach=cuda)
    install_shims(shims, request, tracker, context, state)

    from torch.utils.module_tracker import ModuleTracker

    module_tracker = ModuleTracker()
    context.module_tracker = module_tracker
    redirect = CudaRedirect(tracker)
    if cuda and mode == "fake":
        install_sdpa_route(shims, make_sdpa_route(sdpa_notes))

    old_argv, old_path = sys.argv, list(sys.path)
    sys.argv = [script, *request.get("args", [])]
    sys.path.insert(0, script_dir)
    # Without numpy, torch.sym_max (which the meta kernel of each op met with
    # new shapes calls, often several times) tries `import numpy` on every
    # call: a search of sys.path, as a failed import is not remembered. None in
    # sys.modules makes the import fail at once, as it would fail anyway.
    numpy_missing = "numpy" not in sys.modules and importlib.util.find_spec("numpy") is None
    if numpy_missing:
        sys.modules["numpy"] = None
    prof = None
    if request.get("profile_replay"):
        from torch.profiler import ProfilerActivity, profile

        prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
    status = "finished"
    failure = None
    started = time.perf_counter()
    try:
        if prof is not None:
            prof.start()
        try:
            with module_tracker, _script_autocast(request.get("autocast_dtype")):
                if fake_mode is not None:
                    with fake_mode, tracker, redirect:
                        runpy.run_path(script, run_name="__main__")
                elif request.get("track", True):
                    with tracker, redirect:
                        runpy.run_path(script, run_name="__main__")
                else:
                    # A bare real run, to time the steps the estimate replaces:
                    # nothing counted at the dispatcher.
                    with redirect:
                        runpy.run_path(script, run_name="__main__")
        finally:
            if prof is not None:
                prof.stop()
    except StopEstimate:
        status = "stopped"
    except SystemExit as exit_:
        status = "finished" if exit_.code in (None, 0) else "script-exit"
        if status == "script-exit":
            frames = _user_frames(exit_.__traceback__, script_dir)
            failure = {
                "kind": "script-error",
                "message": f"the script called sys.exit({exit_.code!r})",
                "exit_code": exit_.code,
                "where": frames[-1] if frames else None,
            }
    except Exception as error:  # noqa: BLE001 - the user's code: every failure is reported, classified
        status = "failed"
        frames = _user_frames(error.__traceback__, script_dir)
        failure = {
            "kind": classify_failure(error),
            "type": type(error).__name__,
            "message": str(error).strip().splitlines()[0][:500]
            if str(error).strip()
            else type(error).__name__,
            "where": frames[-1] if frames else None,
            "frames": frames,
            "traceback": "".join(traceback.format_exception(type(error), error, error.__traceback__))[-4000:],
        }
    finally:
        elapsed = time.perf_counter() - started
        sys.argv, sys.path[:] = old_argv, old_path
        if numpy_missing and sys.modules.get("numpy", False) is None:
            del sys.modules["numpy"]
        for hook in state.get("hooks", []):
            hook.remove()
        shims.undo()

    peak = tracker.peak_info
    result.update(
        status=status,
        failure=failure,
        steps=state["steps"],
        seconds=elapsed,
        step_seconds=_step_seconds(started, state["step_ends"]),
        peak_bytes=tracker.peak,
        breakdown={category: peak.get("by_category", {}).get(category, 0) for category in CATEGORIES},
        peak_op=peak.get("op", ""),
        peak_module=peak.get("module", ""),
        peak_phase=peak.get("phase", ""),
        peak_line=list(peak["line"]) if peak.get("line") else None,
        top_modules=_top(peak.get("by_module", {})),
        top_lines=_top(peak.get("by_line", {})),
        events=tracker.events,
        matmuls=sum(
            tracker.op_counts[name] for name in ("mm", "addmm", "bmm", "baddbmm", "linear", "matmul")
        ),
        convolutions=sum(
            tracker.op_counts[name] for name in ("convolution", "mkldnn_convolution", "_convolution")
        ),
        stubbed_scalars=tracker.stubbed_scalars,
        fake_memo_hits=tracker.fake_memo.hits if tracker.fake_memo is not None else None,
        sdpa=sdpa_notes,
        rnn_workspace=rnn_notes,
        conv_scratch=conv_notes,
        compiled=state.get("compiled", 0),
        script_autocast=request.get("autocast_dtype")
        if request.get("autocast_dtype") not in (None, "fp32")
        else None,
        autocast_regions=state.get("autocast_regions", 0),
        autocast_dtypes=sorted(state.get("autocast_dtypes", ())),
        foreach_pinned=bool(state.get("foreach_pinned")),
        batch_size=state.get("loader_batch") or state.get("argparse_batch"),
        override_applied=state["override_applied"],
        batch_knobs=list(state["batch_knobs"].values()),
        batch_padded=state.get("batch_padded"),
        loaders=state["loaders"],
    )
    if prof is not None:
        result["profile_replay_peak"] = profile_replay_peak(prof)
    return result


def _script_autocast(dtype_name: str | None):
    """`--dtype bf16`: the whole script as if under torch.autocast (on the CPU,
    where the trace runs); backward and optimizer ops are not autocast ops."""
    import contextlib

    if dtype_name in (None, "fp32", "float32"):
        return contextlib.nullcontext()
    dtype = {
        "bf16": torch.bfloat16,
        "bfloat16": torch.bfloat16,
        "fp16": torch.float16,
        "float16": torch.float16,
    }[dtype_name]
    return torch.autocast("cpu", dtype=dtype)


def _step_seconds(started: float, step_ends: list[float]) -> float | None:
    return step_ends[-1] - started if step_ends else None


def _top(counter: dict, limit: int = 8) -> list[list]:
    items = [(name, size) for name, size in counter.items() if size > 0]
    items.sort(key=lambda item: -item[1])
    return [[name, size] for name, size in items[:limit]]


def _arm_watchdog() -> None:
    """oom_lsp/profiling/watchdog.py, loaded by path like this file: the run ends itself if
    its parent dies or its deadline passes."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "profiling", "watchdog.py")
    spec = importlib.util.spec_from_file_location("oom_lsp_watchdog", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.arm_from_environment()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--request", required=True, help="JSON file: script, args, mode, device, runs, output"
    )
    parser.add_argument(
        "--progress-fd", type=int, default=None, help="write progress here, one JSON line per event"
    )
    options = parser.parse_args()
    _arm_watchdog()
    with open(options.request, encoding="utf-8") as handle:
        request = json.load(handle)
    global _progress
    if options.progress_fd is not None:
        _progress = os.fdopen(options.progress_fd, "w", buffering=1)
    _emit("ready")
    results = []
    previous_batch = None
    # Each run executes the script afresh; "double" asks for twice the
    # previous run's batch size (known only once the script has run).
    for run_request in request.get("runs", [{}]):
        batch_size = run_request.get("batch_size")
        if batch_size == "double":
            if not previous_batch:
                break
            batch_size = 2 * previous_batch
        _emit("run-start", batch_size=batch_size)
        result = run({**request, **run_request, "batch_size": batch_size})
        results.append(result)
        _emit("run", batch_size=result["batch_size"], status=result["status"])
        previous_batch = result["batch_size"] if result["status"] != "failed" else None
    with open(request["output"], "w", encoding="utf-8") as handle:
        json.dump({"runs": results}, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
