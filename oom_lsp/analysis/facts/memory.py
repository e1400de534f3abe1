"""Bytes at stake, from the size facts: what rules put in their messages.

Each formula cites its source. They are estimates of the tensors a step
keeps, not of the allocator's peak (the estimate command measures that).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from oom_lsp.analysis.facts.results import ModelSize


class Optimizer(enum.Enum):
    """How many fp32 values of state an optimizer keeps per parameter."""

    SGD = 0  # plain SGD: no state
    SGD_MOMENTUM = 1  # the momentum buffer
    RMSPROP = 1  # square_avg (centered RMSprop keeps a second one: not modelled)
    ADAGRAD = 1  # the sum of squares
    ADAM = 2  # exp_avg and exp_avg_sq (AdamW alike)


@dataclass(frozen=True)
class TrainingState:
    parameters: int
    gradients: int
    optimizer: int
    master_weights: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.master_weights


def training_state_bytes(
    model: ModelSize | int,
    *,
    param_bytes: int = 4,
    optimizer: Optimizer = Optimizer.ADAM,
    mixed_precision: bool = False,
) -> TrainingState:
    """Bytes of the weights, their gradients and the optimizer state.

    Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
    Trillion Parameter Models" (arXiv 1910.02054), section 3.1: mixed-precision
    Adam keeps 2Ψ bytes of fp16 weights, 2Ψ of fp16 gradients and 12Ψ of fp32
    state (a master copy of the weights, momentum, variance): 16Ψ. In full
    fp32 (`param_bytes=4`, no `mixed_precision`) the gradients are fp32 and
    there is no master copy: 4Ψ + 4Ψ + 8Ψ, also 16Ψ. Optimizer state is fp32
    in both (torch's optimizers keep it in the parameter's dtype: with pure
    bf16 weights and no master copy, pass `param_bytes=2` and it is 2 bytes).
    """
    count = model.parameters if isinstance(model, ModelSize) else int(model)
    state_bytes = 4 if mixed_precision else param_bytes
    return TrainingState(
        parameters=count * param_bytes,
        gradients=count * param_bytes,
        optimizer=count * optimizer.value * state_bytes,
        master_weights=count * 4 if mixed_precision and param_bytes != 4 else 0,
    )


def transformer_activation_bytes_per_layer(
    batch: int,
    sequence: int,
    hidden: int,
    heads: int,
    *,
    activation_bytes: int = 2,
    dropout: bool = True,
    flash_attention: bool = False,
) -> int:
    """Bytes one transformer layer keeps for the backward pass.

    Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
    Transformer Models" (arXiv 2205.05198), section 4.1, equation 1: with
    16-bit activations and 1-byte dropout masks a GPT layer stores
    s·b·h·(34 + 5·a·s/h) bytes: attention 11sbh + 5as²b (QKV input, Q, K, V,
    softmax output, its dropout mask and output, the output projection's input
    and its dropout mask), MLP 19sbh (two linears' inputs, the GeLU's input,
    a dropout mask), two LayerNorms' inputs 4sbh.

    Split into 2-byte tensors and 1-byte masks, that is 16sbh + 2as²b
    elements of activations and 2sbh + as²b mask bytes, which is how other
    dtypes (`activation_bytes=4` for fp32: 66sbh + 9as²b) and no dropout
    (no masks: 32sbh + 4as²b in fp16) follow. With a fused attention kernel
    (FlashAttention, `scaled_dot_product_attention`'s flash or memory-efficient
    path) the s² terms are never stored, as the paper's selective recomputation
    of them: 34sbh in fp16 with dropout.

    The formula is for the GPT layer of the paper (a 4h GeLU MLP); a gated
    MLP (Llama's SwiGLU at 8h/3) stores somewhat more.
    """
    s, b, h, a = sequence, batch, hidden, heads
    linear = 16 * activation_bytes + (2 if dropout else 0)
    quadratic = 0 if flash_attention else 2 * activation_bytes + (1 if dropout else 0)
    return s * b * h * linear + a * s * s * b * quadratic


def attention_scores_bytes(batch: int, heads: int, query_length: int, key_length: int | None = None, *, dtype_bytes: int = 4) -> int:
    """Bytes of one materialized attention score matrix, `q @ k.transpose(-2, -1)`:
    batch × heads × query length × key length elements (Vaswani et al. 2017,
    "Attention Is All You Need", section 3.2.1: the softmax is taken over this
    matrix). A hand-written attention keeps it, its softmax and, in training,
    its dropout for the backward pass: each is another matrix of this size."""
    keys = query_length if key_length is None else key_length
    return batch * heads * query_length * keys * dtype_bytes
