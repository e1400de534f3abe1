"""What a fake run answers when the script reads a tensor's values outside
`.item()`: `f"{loss:.4f}"`, `.tolist()`, `.numpy()`, and `torch.tensor([...])` of
fake scalars.

`Tensor.__format__` formats the value only when `type(self) is Tensor`, so a
fake 0-dim tensor (a FakeTensor) gets `object.__format__`, which rejects any
format spec: the script's `print(f"loss {loss:.4f}")` would crash. Here it
reads `.item()` as a plain tensor does (a real twin's value, a constant, or a
data-dependent read answered 0).

`FakeTensor.tolist()` reads one element at a time (a `select` and an `.item()`
each, ~70 us apiece under the tracker): a real twin (integer tensors computed
outside the step, see `StorageTracker.shadows`) or a constant answers it
whole, and a tensor whose values only a real run knows answers zeros of its
shape at once, each element counted as a data-dependent read, as the
per-element path would.

`FakeTensor.numpy()` (and `np.asarray(t)`, which calls it) is a real array of the tensor's shape
and dtype: the real twin's values where known, else zeros, each such array counted (`value_arrays`).
The NumPy or SciPy code after it then runs on real values of the right shape (DETR's Hungarian
matcher solves `linear_sum_assignment` on a zero cost matrix: the same number of pairs, so the
same shapes from there on); its result comes back through `torch.as_tensor` as a fake tensor.

`torch.tensor(values)` reads each element's value in C++, which a fake tensor has not: a list of
fake 0-dim tensors (torchtune's Llama 3 RoPE scaling builds its frequencies one by one in Python)
is stacked instead, with the dtype torch would infer and the device asked for; `torch.as_tensor` of
such a list (torchvision's `Normalize` of a mean and std computed from the data set) the same way."""

from __future__ import annotations

import os

import torch


def install(shims, tracker) -> None:
    from torch._subclasses.fake_tensor import FakeTensor

    original_format = torch.Tensor.__format__

    def tensor_format(self, format_spec):
        if type(self) is FakeTensor and self.dim() == 0:
            return self.detach().item().__format__(format_spec)
        return original_format(self, format_spec)

    shims.patch(torch.Tensor, "__format__", tensor_format)

    def tolist(self):
        if self.dim() == 0:
            return self.item()

        def read(twin):
            if twin is not None:
                return twin.tolist()
            if self.dtype == torch.bool:
                dtype = torch.bool
            elif self.dtype.is_floating_point or self.dtype.is_complex:
                dtype = torch.float64
            else:
                dtype = torch.int64
            tracker.stubbed_scalars += self.numel()
            return torch.zeros(self.shape, dtype=dtype).tolist()

        return _with_known_values(tracker, self, read)

    shims.patch(FakeTensor, "tolist", tolist)

    def numpy(self, *, force=False):
        def read(twin):
            if twin is not None:
                return twin.detach().numpy(force=True)
            tracker.value_arrays += 1
            tracker.last_stubbed_read = tracker.context.user_line()
            return torch.zeros(self.shape, dtype=self.dtype).numpy()

        return _with_known_values(tracker, self, read)

    shims.patch(FakeTensor, "numpy", numpy)

    original_tensor = torch.tensor

    def tensor(data, *args, **kwargs):
        if not args and _holds_fake(data, FakeTensor):
            return _stacked(data, **kwargs)
        return original_tensor(data, *args, **kwargs)

    shims.patch(torch, "tensor", tensor)

    original_as_tensor = torch.as_tensor

    def as_tensor(data, *args, **kwargs):
        # A list of fake scalars (torchvision's `Normalize(mean, std)` of statistics the script
        # computed from its data set) is copied element by element, as torch.tensor does; a
        # tensor itself keeps as_tensor's no-copy meaning.
        if not args and isinstance(data, (list, tuple)) and _holds_fake(data, FakeTensor):
            return _stacked(data, dtype=kwargs.get("dtype"), device=kwargs.get("device"))
        return original_as_tensor(data, *args, **kwargs)

    shims.patch(torch, "as_tensor", as_tensor)

    original_load = torch.load

    def load(f, map_location=None, *args, **kwargs):
        size = _file_size(f)
        if (
            tracker.paused
            or size is None
            or size > REAL_LOAD_LIMIT
            or not _onto_cpu(map_location)
        ):
            return original_load(f, map_location, *args, **kwargs)
        # A small file holding integer tensors (a processed data set: labels, an edge index,
        # masks): its real values, as a real run reads them, so that what the script reads of them (`int(y.max()) + 1`
        # classes, an edge index) is what a real run reads. Each storage restored is counted as
        # the load's allocation; the tensors are real (fake mode takes them as inputs, and the
        # values read of them and of what is computed from them are exact).
        restored = []
        elsewhere = []

        def keep(storage, location):
            # Read onto the CPU in any case; kept only when the file's tensors were saved there
            # (a GPU's would be device memory in a real run: loaded as before then).
            restored.append(storage)
            if location != "cpu":
                elsewhere.append(location)
            return storage

        from torch._subclasses.fake_tensor import unset_fake_temporarily

        start = None if isinstance(f, (str, os.PathLike)) else f.tell()
        result = None
        tracker.paused += 1
        try:
            with unset_fake_temporarily():
                result = original_load(f, keep, *args, **kwargs)
                carriers = [torch.empty(0, dtype=torch.uint8).set_(storage) for storage in restored]
        except Exception:  # noqa: BLE001 - any file not readable for real is loaded as before, below
            carriers = None
        finally:
            tracker.paused -= 1
        if carriers is None or elsewhere or not _holds_exact_values(result):
            # Not readable for real here, saved from a GPU, or nothing in it whose values a
            # script reads (a model's weights: floating point):
            # loaded as before, onto storages without data.
            carriers = result = None  # the real storages go now, not after the load below
            restored.clear()
            if start is not None:
                f.seek(start)
            return original_load(f, map_location, *args, **kwargs)
        for carrier in carriers:
            tracker.register(carrier, False, "torch.load")
        return result

    shims.patch(torch, "load", load)


def _holds_exact_values(value, depth: int = 0) -> bool:
    """Whether a loaded object holds an integer or boolean tensor (labels, an edge index, masks:
    values scripts read), looking through containers and objects' attributes a few levels deep."""
    if isinstance(value, torch.Tensor):
        return not (value.dtype.is_floating_point or value.dtype.is_complex)
    if depth >= 6:
        return False
    if isinstance(value, dict):
        items = value.values()
    elif isinstance(value, (list, tuple)):
        items = value
    elif hasattr(value, "__dict__") and not isinstance(value, type):
        items = vars(value).values()
    else:
        return False
    return any(_holds_exact_values(item, depth + 1) for item in items)


# A file up to this size is read for real by a fake run's `torch.load` (a checkpoint above it is
# loaded onto meta storages, its data unread).
REAL_LOAD_LIMIT = 256 << 20


def _file_size(f) -> int | None:
    """The size of a path or a seekable file object; None when it cannot be known."""
    if isinstance(f, (str, os.PathLike)):
        try:
            return os.path.getsize(f)
        except OSError:
            return None
    try:
        here = f.tell()
        end = f.seek(0, 2)
        f.seek(here)
        return end - here
    except (AttributeError, OSError, ValueError):
        return None


def _onto_cpu(map_location) -> bool:
    """A load that restores onto the CPU, or where each tensor was saved (CPU files)."""
    if map_location is None:
        return True
    if isinstance(map_location, str):
        return map_location == "cpu"
    if isinstance(map_location, torch.device):
        return map_location.type == "cpu"
    return False


def _with_known_values(tracker, tensor, read):
    """`read(real twin or constant, or None)` outside fake mode, uncounted."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    twin = tracker.shadows.get(tensor) if tracker.shadows is not None else None
    if twin is None and tensor.constant is not None:
        twin = tensor.constant
    tracker.paused += 1
    try:
        with unset_fake_temporarily():
            return read(twin)
    finally:
        tracker.paused -= 1


def _holds_fake(data, fake_type) -> bool:
    if isinstance(data, fake_type):
        return True
    if isinstance(data, (list, tuple)):
        return any(_holds_fake(item, fake_type) for item in data)
    return False


def _leaf_dtype(item) -> torch.dtype:
    if isinstance(item, torch.Tensor):
        return item.dtype
    if isinstance(item, bool):
        return torch.bool
    if isinstance(item, int):
        return torch.int64
    if isinstance(item, complex):
        return torch.complex64 if torch.get_default_dtype() == torch.float32 else torch.complex128
    return torch.get_default_dtype()


def _leaves(data) -> list:
    if isinstance(data, (list, tuple)):
        return [leaf for item in data for leaf in _leaves(item)]
    return [data]


def _stacked(data, dtype=None, device=None, requires_grad=False, pin_memory=False):
    """`torch.tensor(data)` for nested lists holding fake scalars: the elements stacked."""
    if dtype is None:
        dtype = _leaf_dtype(_leaves(data)[0])
        for leaf in _leaves(data)[1:]:
            dtype = torch.promote_types(dtype, _leaf_dtype(leaf))

    def build(item):
        if isinstance(item, (list, tuple)):
            return torch.stack([build(part) for part in item])
        if isinstance(item, torch.Tensor):
            if item.numel() != 1:
                raise ValueError("only one element tensors can be converted to Python scalars")
            return item.detach().reshape(()).to(dtype)
        return torch.full((), item, dtype=dtype)

    result = build(data)
    result = result.to(device) if device is not None else result
    return result.requires_grad_(requires_grad) if requires_grad else result
