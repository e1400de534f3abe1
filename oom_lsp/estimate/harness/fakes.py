"""The FakeTensorMode of a fake run, and deep copies of its tensors.

`copy.deepcopy` of a fake tensor (nn.TransformerEncoder copies its layer, an EMA model its model,
torchmetrics' `add_state` its default `torch.tensor(0.0)`) clones it and deep-copies its `__dict__`:

- `fake_mode` is in it: the copy would belong to a mode of its own, a foreign tensor that the
  run's mode converts afresh in every op that reads it. The mode copies as itself.
- so is `constant`, the real value fake mode keeps of a small tensor made from data
  (`torch.tensor(0.0)`): a plain CPU tensor, deep-copied while the fake mode is active, so its
  storage is cloned into a fake (meta) storage that the copy cannot be set to ("Attempted to set
  the storage of a tensor on device "meta" to a storage on different device "cpu"": Lightning's
  `self.log` crashed there). It is copied outside fake mode, as a real tensor is.
"""

from __future__ import annotations

import copy


def make_fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_mode.__deepcopy__ = lambda memo: fake_mode
    return fake_mode


def install(shims) -> None:
    from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

    original_deepcopy = FakeTensor.__deepcopy__

    def fake_deepcopy(self, memo):
        constant = self.__dict__.get("constant")
        if constant is not None and id(constant) not in memo:
            with unset_fake_temporarily():
                memo[id(constant)] = copy.deepcopy(constant, memo)
        return original_deepcopy(self, memo)

    shims.patch(FakeTensor, "__deepcopy__", fake_deepcopy)
