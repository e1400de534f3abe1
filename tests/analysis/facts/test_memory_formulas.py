"""The byte formulas the rules quote, against their sources' own figures."""

from __future__ import annotations

from oom_lsp.analysis.facts.memory import (
    Optimizer,
    attention_scores_bytes,
    training_state_bytes,
    transformer_activation_bytes_per_layer,
)
from oom_lsp.analysis.facts.results import ModelSize


def test_adam_training_state_is_16_bytes_per_parameter_as_zero_says() -> None:
    # ZeRO section 3.1: a 1.5B-parameter GPT-2 needs 24 GB of model states with mixed-precision Adam.
    state = training_state_bytes(1_500_000_000, param_bytes=2, mixed_precision=True)
    assert state.total == 16 * 1_500_000_000 == 24_000_000_000
    assert (state.parameters, state.gradients, state.optimizer, state.master_weights) == (3e9, 3e9, 12e9, 6e9)
    assert training_state_bytes(1000).total == 16_000  # fp32 Adam: 4 + 4 + 8
    model = ModelSize(parameters=1000, exact=True, evidence="")
    assert training_state_bytes(model, optimizer=Optimizer.SGD).total == 8_000
    assert training_state_bytes(model, optimizer=Optimizer.SGD_MOMENTUM).total == 12_000


def test_korthikanti_equation_one() -> None:
    s, b, h, a = 2048, 4, 4096, 32
    assert transformer_activation_bytes_per_layer(b, s, h, a) == s * b * h * 34 + 5 * a * s * s * b
    assert transformer_activation_bytes_per_layer(b, s, h, a, flash_attention=True) == 34 * s * b * h
    assert transformer_activation_bytes_per_layer(b, s, h, a, activation_bytes=4) == 66 * s * b * h + 9 * a * s * s * b
    assert transformer_activation_bytes_per_layer(b, s, h, a, dropout=False) == 32 * s * b * h + 4 * a * s * s * b


def test_attention_score_matrix() -> None:
    assert attention_scores_bytes(8, 12, 1024) == 8 * 12 * 1024 * 1024 * 4
    assert attention_scores_bytes(2, 4, 16, 32, dtype_bytes=2) == 2 * 4 * 16 * 32 * 2
