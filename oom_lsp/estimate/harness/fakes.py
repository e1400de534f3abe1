"""The FakeTensorMode of a fake run, deep copies of its tensors, and where their data would be.

`copy.deepcopy` of a fake tensor (nn.TransformerEncoder copies its layer, an EMA model its model,
torchmetrics' `add_state` its default `torch.tensor(0.0)`) clones it and deep-copies its `__dict__`:

- `fake_mode` is in it: the copy would belong to a mode of its own, a foreign tensor that the
  run's mode converts afresh in every op that reads it. The mode copies as itself.
- so is `constant`, the real value fake mode keeps of a small tensor made from data
  (`torch.tensor(0.0)`): a plain CPU tensor, deep-copied while the fake mode is active, so its
  storage is cloned into a fake (meta) storage that the copy cannot be set to ("Attempted to set
  the storage of a tensor on device "meta" to a storage on different device "cpu"": Lightning's
  `self.log` crashed there). It is copied outside fake mode, as a real tensor is.
- torch's `Tensor.__deepcopy__` clones a tensor whose `data_ptr()` is 0 (a fake one: the clone is
  an op, which the tracker counts) and copies the storage of any other below the dispatcher, where
  nothing counts it. Fake tensors answer a data pointer of their own (below), so the copy asks for
  0 while it runs: an EMA made by `deepcopy(model)` is counted, as a real run holds it.

Every fake storage answers a data pointer of its own: a fake address, distinct for each live
storage, with room for its bytes. Libraries key tensors by where their data is: Transformers'
`save_pretrained` groups a state dict's tensors by `untyped_storage().data_ptr()` to find tied
weights (every fake tensor answered 0, so all of one size were "shared tensors" and it refused to
save), safetensors does the same, and Accelerate's FSDP2 preparation maps each parameter to its
sharded one by `data_ptr()`.
"""

from __future__ import annotations

import copy
import weakref

import torch

# Fake addresses start far above any real one and leave a page between two storages.
_FIRST_ADDRESS = 1 << 46
_PAGE = 4096


def make_fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_mode.__deepcopy__ = lambda memo: fake_mode
    return fake_mode


class FakeAddresses:
    """A fake address for each live fake storage, given the first time it is asked for."""

    def __init__(self) -> None:
        self.by_storage: dict[int, int] = {}
        self.next = _FIRST_ADDRESS
        self.copying = 0  # deep copies under way: data_ptr() answers 0, as torch's clone path wants

    def of(self, storage) -> int:
        key = id(storage)
        address = self.by_storage.get(key)
        if address is None:
            address = self.by_storage[key] = self.next
            self.next += -(-max(storage.nbytes(), 1) // _PAGE) * _PAGE + _PAGE
            weakref.finalize(storage, self.by_storage.pop, key, None)
        return address


def install(shims) -> None:
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    addresses = FakeAddresses()
    original_deepcopy = FakeTensor.__deepcopy__

    def fake_deepcopy(self, memo):
        constant = self.__dict__.get("constant")
        if constant is not None and id(constant) not in memo:
            with unset_fake_temporarily():
                memo[id(constant)] = copy.deepcopy(constant, memo)
        addresses.copying += 1
        try:
            return original_deepcopy(self, memo)
        finally:
            addresses.copying -= 1

    shims.patch(FakeTensor, "__deepcopy__", fake_deepcopy)

    def tensor_data_ptr(self) -> int:
        if addresses.copying:
            return 0
        return addresses.of(self.untyped_storage()) + self.storage_offset() * self.element_size()

    shims.patch(FakeTensor, "data_ptr", tensor_data_ptr)
    storage_class = torch.UntypedStorage
    original_storage_data_ptr = storage_class.data_ptr

    def storage_data_ptr(self) -> int:
        # A fake tensor's storage is on the meta device; so is a meta tensor's, which holds no
        # memory either: each answers an address of its own.
        if self.device.type == "meta" and not addresses.copying:
            return addresses.of(self)
        return original_storage_data_ptr(self)

    shims.patch(storage_class, "data_ptr", storage_data_ptr)
