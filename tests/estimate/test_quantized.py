"""Quantized layers whose kernels have no fake implementation (issue 16): the estimate falls back
to real CPU steps, which run the library's CPU backend, and must say so, naming the layers, rather
than present that measurement as its CUDA kernels' (harness/quantized.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from oom_lsp.estimate.estimator import EstimateOptions, estimate
from oom_lsp.estimate.gpus import find_gpu

# A stand-in for a quantization library, under one of the package names the harness knows: its
# weight wraps its tensor with `Tensor._make_subclass`, as bitsandbytes' Params4bit does, which
# fake tensors refuse ("Creating a new Tensor subclass ... already associated to a python object
# of type FakeTensor").
LIBRARY = """
import torch

class QuantizedWeight(torch.nn.Parameter):
    def __new__(cls, data, requires_grad=False):
        return torch.Tensor._make_subclass(cls, data.to(torch.int8), requires_grad)

class QuantizedLinear(torch.nn.Module):
    def __init__(self, inputs, outputs):
        super().__init__()
        self.weight = QuantizedWeight(torch.randn(outputs, inputs))

    def forward(self, x):
        return x @ self.weight.t().to(x.dtype)
"""

SCRIPT = """
import torch
from hqq import QuantizedLinear
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Sequential(QuantizedLinear(512, 512), torch.nn.Linear(512, 10)).to(device)
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
for _ in range(3):
    model(torch.randn(64, 512, device=device)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
"""


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_fallback_over_quantized_layers_says_what_it_measured(tmp_path, device):
    (tmp_path / "hqq").mkdir()
    (tmp_path / "hqq" / "__init__.py").write_text(LIBRARY)
    script = tmp_path / "train_quantized.py"
    script.write_text(SCRIPT)
    gpu = find_gpu("A100 40GB") if device == "cuda" else None
    prediction = estimate(EstimateOptions(script=script, device=device, gpu=gpu, timeout=300)).to_json()
    assert prediction["method"] == "a real CPU step at the script's own batch size"
    uncertainty = prediction["fallback"]["uncertainty"]
    assert "quantized layers (1 hqq.QuantizedLinear): the fake run failed inside hqq" in uncertainty
    assert "not its CUDA kernels" in uncertainty
    # The CUDA prediction does not claim a trace on the fake device it never made.
    notes = {note["name"]: note["detail"] for note in prediction["corrections"]}
    if device == "cuda":
        assert notes["traced-on-cpu"].startswith("measured by real CPU steps")
