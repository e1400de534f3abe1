"""CUDA's kernel choices, emulated on the CPU trace: scaled dot-product
attention routed to CUDA's fused kernels' meta implementations (as far as the
script's `sdpa_kernel` choice allows), FlexAttention as its compiled CUDA
kernels allocate, cuDNN's RNN reserve space (the meta kernel reports none).

The script runs its GPU path, chosen for the target it is told it has (torchtune
picks FlexAttention on sm >= 7.5), while the trace runs on the CPU, where some of
those kernels do not exist (FlexAttention has no CPU backward): each is replaced
by what its CUDA kernel allocates, on fake tensors (the route is installed only
for fake runs of `--device cuda`)."""

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
        # The backends the script left enabled (`with sdpa_kernel(...)`, torch.backends.cuda.enable_*).
        flash_on = torch.backends.cuda.flash_sdp_enabled()
        efficient_on = torch.backends.cuda.mem_efficient_sdp_enabled()
        if enable_gqa or query.dim() != 4 or key.shape[-3] != query.shape[-3] or not (flash_on or efficient_on):
            notes["sdpa_math_kept"] = notes.get("sdpa_math_kept", 0) + 1
            return None
        head_dim = query.shape[-1]
        flash_dtype = query.dtype in (torch.float16, torch.bfloat16)
        flash = flash_on and attn_mask is None and flash_dtype and head_dim % 8 == 0 and head_dim <= 256
        if flash or not efficient_on:
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


class _FlexAttentionCuda(torch.autograd.Function):
    """What FlexAttention's compiled CUDA kernels allocate (torch/_inductor/kernel/flex): forward,
    the output (the query's layout, the value's head size) and the logsumexp and max scores in
    fp32, B x Hq x L; backward, delta (fp32, B x Hq x L) and the gradients of the query, key and
    value in their own shapes. The autograd node keeps the query, key, value, output and
    logsumexp, as FlexAttention's does. Values are never computed: fake tensors only."""

    @staticmethod
    def forward(ctx, query, key, value):
        out = _dense_like(query, (*query.shape[:-1], value.shape[-1]))
        logsumexp = query.new_empty(query.shape[:-1], dtype=torch.float32)
        max_scores = query.new_empty(query.shape[:-1], dtype=torch.float32)
        del max_scores  # returned only with return_aux; freed by the kernel's caller otherwise
        ctx.save_for_backward(query, key, value, out, logsumexp)
        ctx.mark_non_differentiable(logsumexp)
        return out, logsumexp

    @staticmethod
    def backward(ctx, grad_out, grad_logsumexp):
        query, key, value, out, logsumexp = ctx.saved_tensors
        delta = logsumexp.new_empty(logsumexp.shape)
        grads = tuple(_dense_like(tensor, tensor.shape) for tensor in (query, key, value))
        del delta
        return grads


def _dense_like(tensor, shape):
    """A dense tensor of `shape` whose dimensions are laid out in `tensor`'s order (Inductor's
    `infer_dense_strides`): a query permuted from (batch, length, heads, dim) gives an output whose
    `transpose(1, 2).reshape(...)` is a view, not a copy."""
    order = sorted(range(tensor.dim()), key=lambda dim: -tensor.stride(dim))
    return torch.empty_permuted(shape, order, dtype=tensor.dtype, device=tensor.device)


def make_flex_route(notes: dict):
    """torch.nn.attention.flex_attention.flex_attention as its CUDA kernels allocate."""

    def flex_attention(query, key, value, score_mod=None, block_mask=None, scale=None, enable_gqa=False,
                       return_lse=False, kernel_options=None, *, return_aux=None):
        notes["flex_attention"] = notes.get("flex_attention", 0) + 1
        out, logsumexp = _FlexAttentionCuda.apply(query, key, value)
        if return_lse:
            return out, logsumexp
        if return_aux is not None:
            from torch.nn.attention.flex_attention import AuxOutput

            return out, AuxOutput(lse=logsumexp if getattr(return_aux, "lse", False) else None)
        return out

    return flex_attention


def install_flex_route(shims, route) -> None:
    """Where FlexAttention is bound: its module, and any module that imported it by name before
    (torchtune binds `flex_attention` and compiles it at import; torch.compile is eager here)."""
    try:
        from torch.nn.attention import flex_attention as flex_module
    except ImportError:
        return
    shims.patch_everywhere(flex_module, "flex_attention", route)


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
