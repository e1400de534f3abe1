"""What a fake run answers when the script reads a tensor's values outside
`.item()`: `f"{loss:.4f}"` and `.tolist()`.

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
per-element path would."""

from __future__ import annotations

import torch


def install(shims, tracker) -> None:
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    original_format = torch.Tensor.__format__

    def tensor_format(self, format_spec):
        if type(self) is FakeTensor and self.dim() == 0:
            return self.detach().item().__format__(format_spec)
        return original_format(self, format_spec)

    shims.patch(torch.Tensor, "__format__", tensor_format)

    def tolist(self):
        if self.dim() == 0:
            return self.item()
        twin = tracker.shadows.get(self) if tracker.shadows is not None else None
        if twin is None and self.constant is not None:
            twin = self.constant
        tracker.paused += 1
        try:
            with unset_fake_temporarily():
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
        finally:
            tracker.paused -= 1

    shims.patch(FakeTensor, "tolist", tolist)
