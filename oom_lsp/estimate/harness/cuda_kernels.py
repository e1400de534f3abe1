"""CUDA's kernel choices, emulated on the CPU trace: scaled dot-product
attention routed to CUDA's fused kernels' meta implementations, cuDNN's RNN
reserve space (the meta kernel reports none)."""

from __future__ import annotations

import torch

from .common import aten


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


def make_cudnn_rnn_reserve(notes: dict):
    """cuDNN's training reserve space of an RNN layer, which the meta kernel
    reports as 0 bytes, modelled as the per-timestep gate activations, cell
    and hidden states (6 x hidden per element, not yet calibrated on a GPU)."""

    def cudnn(tracker, args, outputs):
        inp = args[0]
        seq, batch, _ = inp.shape
        hidden = outputs[1].shape[-1]
        reserve = 6 * seq * batch * hidden * inp.element_size()
        notes["bytes"] = max(notes.get("bytes", 0), reserve)
        notes["calls"] = notes.get("calls", 0) + 1
        return reserve

    return cudnn
