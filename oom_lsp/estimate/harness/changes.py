"""The changes `oom-lsp estimate --what-if` traces without editing the script: each is what a
user would write, done from outside.

- "accumulation": N. Gradient accumulation over N micro-batches: of every N optimizer steps
  the script takes, the first N - 1 are skipped (a step given a closure still runs it, as
  Lightning's closure holds the forward and backward), and so are the `zero_grad` calls
  between a skipped step and the next backward, so gradients add up as they do in
  `if (i + 1) % N == 0: optimizer.step(); optimizer.zero_grad()`.
- "checkpoint_blocks": True. Activation checkpointing per block: the modules of each
  outermost `nn.ModuleList`/`nn.Sequential` that holds two or more modules of one class with
  submodules (a transformer's layers, a ResNet stage's blocks) run under
  `torch.utils.checkpoint.checkpoint(..., use_reentrant=False)` while training with
  autograd on.
- "optimizer": "fused" (Adam, AdamW, SGD built with `fused=True`) or "adafactor"
  (`torch.optim.Adafactor` built where the script builds Adam or AdamW, with its learning
  rate and weight decay)."""

from __future__ import annotations

import functools
import types
import weakref

import torch
from torch import nn

FUSABLE = ("Adam", "AdamW", "SGD")
REPLACED_BY_ADAFACTOR = ("Adam", "AdamW")


def install(shims, request: dict, state: dict) -> None:
    every = int(request.get("accumulation") or 1)
    if every > 1:
        _install_accumulation(shims, every, state)
    if request.get("checkpoint_blocks"):
        _install_block_checkpointing(state)
    optimizer = request.get("optimizer")
    if optimizer == "fused":
        _install_fused(shims, state)
    elif optimizer == "adafactor":
        _install_adafactor(shims, state)
    elif optimizer is not None:
        raise ValueError(f"unknown optimizer change {optimizer!r}")


def _install_accumulation(shims, every: int, state: dict) -> None:
    state["accumulation"] = {"every": every, "skipped_steps": 0, "skipped_zero_grads": 0}
    # True from a skipped step until the next backward: the zero_grad calls in between are skipped.
    accumulating = [False]
    calls = weakref.WeakKeyDictionary()

    def skipping(optimizer, step):
        # A bound method, as the step it replaces: an LR scheduler rewraps `optimizer.step` through
        # its `__func__`.
        @functools.wraps(step)
        def step_every(self, *args, **kwargs):
            calls[self] = calls.get(self, 0) + 1
            if calls[self] % every == 0:
                return step(*args, **kwargs)
            state["accumulation"]["skipped_steps"] += 1
            closure = kwargs.get("closure", args[0] if args else None)
            loss = None
            if closure is not None:
                with torch.enable_grad():
                    loss = closure()
            accumulating[0] = True
            return loss

        return types.MethodType(step_every, optimizer)

    original_init = torch.optim.Optimizer.__init__

    def init(self, *args, **kwargs):
        original_init(self, *args, **kwargs)
        # An instance attribute: an LR scheduler, GradScaler or Accelerate's wrapper call it
        # as they would call the step.
        self.step = skipping(self, self.step)

    shims.patch(torch.optim.Optimizer, "__init__", init)

    def zero_grad_unless_accumulating(original):
        @functools.wraps(original)
        def zero_grad(self, *args, **kwargs):
            if accumulating[0]:
                state["accumulation"]["skipped_zero_grads"] += 1
                return None
            return original(self, *args, **kwargs)

        return zero_grad

    shims.patch(
        torch.optim.Optimizer, "zero_grad", zero_grad_unless_accumulating(torch.optim.Optimizer.zero_grad)
    )
    shims.patch(nn.Module, "zero_grad", zero_grad_unless_accumulating(nn.Module.zero_grad))
    original_backward = torch.autograd.backward

    def backward(*args, **kwargs):
        accumulating[0] = False
        return original_backward(*args, **kwargs)

    shims.patch(torch.autograd, "backward", backward)


def _install_block_checkpointing(state: dict) -> None:
    from torch.utils.checkpoint import checkpoint

    state["checkpointed_blocks"] = {}
    seen = weakref.WeakSet()

    def checkpointed(module, forward):
        @functools.wraps(forward)
        def run(*args, **kwargs):
            if module.training and torch.is_grad_enabled():
                return checkpoint(forward, *args, use_reentrant=False, **kwargs)
            return forward(*args, **kwargs)

        return run

    def wrap_blocks(root: nn.Module) -> None:
        pending = [root]
        while pending:
            module = pending.pop()
            if module in seen:
                continue
            seen.add(module)
            blocks = _blocks_of(module)
            if blocks:
                kind = type(blocks[0]).__name__
                state["checkpointed_blocks"][kind] = state["checkpointed_blocks"].get(kind, 0) + len(blocks)
                for block in blocks:
                    seen.add(block)
                    block.forward = checkpointed(block, block.forward)
                continue
            pending.extend(module.children())

    def forward_pre(module, inputs):
        if module not in seen and module.training:
            wrap_blocks(module)

    state.setdefault("hooks", []).append(nn.modules.module.register_module_forward_pre_hook(forward_pre))


def _blocks_of(module: nn.Module) -> list[nn.Module]:
    """The blocks of a ModuleList/Sequential: its children of the most common class, when two or
    more share it and are made of submodules (not a bare Linear or activation)."""
    if not isinstance(module, (nn.ModuleList, nn.Sequential)):
        return []
    by_class: dict[type, list[nn.Module]] = {}
    for child in module.children():
        if next(child.children(), None) is not None:
            by_class.setdefault(type(child), []).append(child)
    largest = max(by_class.values(), key=len, default=[])
    return largest if len(largest) >= 2 else []


def _optimizer_class(name: str):
    return getattr(torch.optim, name)


def _install_fused(shims, state: dict) -> None:
    state["optimizer_change"] = set()
    for name in FUSABLE:
        cls = _optimizer_class(name)
        original = cls.__init__

        def init(self, *args, _original=original, **kwargs):
            kwargs["fused"] = True
            kwargs["foreach"] = None
            state["optimizer_change"].add(f"{type(self).__name__}(fused=True)")
            _original(self, *args, **kwargs)

        shims.patch(cls, "__init__", init)


def _install_adafactor(shims, state: dict) -> None:
    state["optimizer_change"] = set()

    class AdafactorInstead(torch.optim.Adafactor):
        def __init__(self, params, lr=1e-2, betas=None, eps=None, weight_decay=0.0, **ignored):
            state["optimizer_change"].add(f"Adafactor instead of {type(self).__name__}")
            super().__init__(params, lr=lr, weight_decay=weight_decay)

    for name in REPLACED_BY_ADAFACTOR:
        shims.patch(torch.optim, name, type(name, (AdafactorInstead,), {}))
