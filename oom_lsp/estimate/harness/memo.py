"""FakeDispatchMemo: fake dispatches answered from earlier calls with the same metadata."""

from __future__ import annotations

import torch

from .common import aten


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
            # Under inference_mode a view is an inference tensor, whose version counter the
            # fake wrapper cannot set: FakeTensorMode makes those itself.
            if not torch.is_inference_mode_enabled():
                return self._indexed_view(func, args)
            return func(*args, **kwargs)
        kind = _MEMO_KINDS.get(func)
        if kind is None:
            kind = _MEMO_KINDS[func] = self._memo_kind(func)
        if kind is NOT_MEMOISABLE:
            return func(*args, **kwargs)
        tensors: list = []
        key = self._key(func, args, kwargs, tensors, kind is ALIASING)
        if key is None or (
            func is INDEX_TENSOR and any(t.dtype in self.SMALL_INDEX_DTYPES for t in tensors[1:])
        ):
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
                (
                    source,
                    tuple(value.shape),
                    value.stride(),
                    offset,
                    value.dtype,
                    value.fake_device,
                    value.requires_grad,
                )
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
                meta = torch.empty_strided(
                    shape, stride, dtype=dtype, device="meta", requires_grad=requires_grad
                )
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
