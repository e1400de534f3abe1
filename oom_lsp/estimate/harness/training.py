"""The training step as the tracker sees it: its phases (forward, backward,
optimizer step), what is a parameter, a gradient, optimizer state; CUDA's
foreach optimizers; the stop after the last traced step; `torch.compile`
traced eagerly and `torch.save` to a path skipped (into a file object: made whole, or the run
fails to real CPU steps rather than hand the script broken bytes to write)."""

from __future__ import annotations

import io
import os
import sys
import time

import torch
from torch import nn

from .common import StopEstimate
from .progress import emit


def install(shims, request: dict, tracker, context, state: dict) -> None:
    original_save = torch.save

    def save(obj, f, *args, **kwargs):
        if isinstance(f, (str, bytes, os.PathLike)):
            return  # a checkpoint file: the fake run writes none
        # A file object: the script writes its bytes somewhere itself (PyG's processed data set,
        # `torch.save` into a BytesIO and then to disk). Bytes without the tensors' values would
        # leave a broken file behind, so they are made only when they can be, whole.
        scratch = io.BytesIO()
        try:
            original_save(obj, scratch, *args, **kwargs)
        except Exception as error:
            raise RuntimeError(
                "torch.save into a file object needs the values of fake tensors, which a fake run "
                "has not (its bytes would be written as a broken file)"
            ) from error
        f.write(scratch.getvalue())

    shims.patch(torch, "save", save)

    # torch.compile: traced eagerly (fake tensors through dynamo are out of
    # scope); fused kernels keep fewer intermediates, so this over-estimates.
    def compile_eagerly(model=None, **kwargs):
        state["compiled"] = state.get("compiled", 0) + 1
        if model is None:
            return lambda fn: fn
        return model

    shims.patch(torch, "compile", compile_eagerly)

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

    step_autocast = _step_autocast(shims, request.get("autocast_dtype"))

    # Forward phase and the module it runs in: global module hooks (which hold nothing: see modules.py).
    def forward_pre(module, inputs):
        if step_autocast is not None and context.forward_depth == 0:
            step_autocast.open()
        context.forward_depth += 1
        context.modules.enter(module)

    def forward_post(module, inputs, output):
        context.forward_depth -= 1
        context.modules.leave()

    state["hooks"] = [
        nn.modules.module.register_module_forward_pre_hook(forward_pre),
        nn.modules.module.register_module_forward_hook(forward_post, always_call=True),
    ]

    # Backward phase.
    original_backward = torch.autograd.backward

    def backward(*args, **kwargs):
        if step_autocast is not None:
            step_autocast.close()
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
        state["live_after_steps"].append(tracker.current)
        state["optimizers"].add((type(optimizer).__name__, bool(optimizer.defaults.get("fused"))))
        state["steps"] += 1
        state["step_ends"].append(time.perf_counter())
        emit("step", step=state["steps"])
        if state["steps"] >= request.get("steps", 2):
            raise StopEstimate()

    state["steps"] = 0
    state["step_ends"] = []
    state["optimizers"] = set()
    # Live bytes as each step ends: what the second step keeps on top of the first is what every
    # step adds (a loss summed with its graph, outputs kept in a list).
    state["live_after_steps"] = []
    state["hooks"] += [
        optimizer_module.register_optimizer_step_pre_hook(step_pre),
        optimizer_module.register_optimizer_step_post_hook(step_post),
    ]


_AUTOCAST_DTYPES = {
    "bf16": torch.bfloat16,
    "bfloat16": torch.bfloat16,
    "fp16": torch.float16,
    "float16": torch.float16,
}


class _StepAutocast:
    """`--dtype bf16`: the step as a user writes mixed precision, `with torch.autocast(...):` around
    the forward pass and the loss: a region opened by each outermost module call (on the CPU, where
    the trace runs) and closed when backward starts, which clears autocast's cache of cast weights,
    as leaving the `with` block does. A script that runs under its own autocast is left alone."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.region = None

    def open(self) -> None:
        if self.region is None and not torch.is_autocast_enabled("cpu"):
            self.region = torch.autocast("cpu", dtype=self.dtype)
            self.region.__enter__()

    def close(self) -> None:
        if self.region is not None:
            region, self.region = self.region, None
            region.__exit__(None, None, None)


def _step_autocast(shims, dtype_name: str | None) -> _StepAutocast | None:
    dtype = _AUTOCAST_DTYPES.get(dtype_name)
    if dtype is None:
        return None
    step_autocast = _StepAutocast(dtype)
    shims.at_undo(step_autocast.close)
    return step_autocast
