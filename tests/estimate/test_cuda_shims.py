"""The GPU the script believes it has (issue 16, cause 4): `torch.accelerator` (pytorch/examples
took their CPU path, and the estimate silently dropped parameters and inputs), CUDA streams
(timm's prefetching loader crashed), and the compute capability of the target GPU."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from oom_lsp.estimate.estimator import EstimateOptions, estimate, run_harness
from oom_lsp.estimate.gpus import find_gpu

# The two Linear layers' weights and biases, each storage rounded up to 512 B as CUDA's allocator does.
PARAMETER_BYTES = sum(-(-size // 512) * 512 for size in (1024 * 1024 * 4, 1024 * 4, 10 * 1024 * 4, 10 * 4))

# As pytorch/examples (mnist, imagenet, word_language_model) pick their device.
ACCELERATOR = """
import torch
use_accel = torch.accelerator.is_available()
device = torch.accelerator.current_accelerator() if use_accel else torch.device("cpu")
torch.accelerator.synchronize()
assert torch.accelerator.device_count() == 1 and torch.accelerator.current_device_index() == 0
model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    x, y = torch.randn(64, 1024).to(device), torch.randint(10, (64,)).to(device)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()
"""

# As timm's PrefetchLoader moves batches: a side stream, waited on, each tensor recorded on the
# main stream.
PREFETCH = """
import torch
from torch.utils.data import DataLoader, TensorDataset

class Prefetcher:
    def __init__(self, loader):
        self.loader = loader
    def __iter__(self):
        stream = torch.cuda.Stream()
        first = True
        for x, y in self.loader:
            with torch.cuda.stream(stream):
                next_x, next_y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
            if not first:
                yield batch_x, batch_y
            first = False
            torch.cuda.current_stream().wait_stream(stream)
            batch_x, batch_y = next_x, next_y
            batch_x.record_stream(torch.cuda.current_stream())
        yield batch_x, batch_y

data = TensorDataset(torch.randn(256, 512), torch.randint(10, (256,)))
model = torch.nn.Linear(512, 10).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
done = torch.cuda.Event()
for x, y in Prefetcher(DataLoader(data, batch_size=32)):
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimizer.step()
    done.record(torch.cuda.current_stream())
    torch.cuda.default_stream().synchronize()
"""

CAPABILITY = """
import json, sys
import torch
properties = torch.cuda.get_device_properties(0)
with open(sys.argv[1], "w") as handle:
    json.dump({
        "capability": list(torch.cuda.get_device_capability()),
        "major_minor": [properties.major, properties.minor],
        "bf16": torch.cuda.is_bf16_supported(),
        "bf16_native": torch.cuda.is_bf16_supported(including_emulation=False),
    }, handle)
model = torch.nn.Linear(8, 8).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(2, 8, device="cuda")).sum().backward()
    optimizer.step()
"""


def test_torch_accelerator_is_the_target_gpu(tmp_path):
    script = tmp_path / "accelerator_example.py"
    script.write_text(ACCELERATOR)
    prediction = estimate(
        EstimateOptions(script=script, device="cuda", gpu=find_gpu("RTX 3090"), timeout=300)
    ).to_json()
    assert prediction["breakdown"]["parameters"] == PARAMETER_BYTES
    assert prediction["breakdown"]["inputs"] > 0


def test_a_prefetching_loader_on_a_side_stream_runs(tmp_path):
    script = tmp_path / "prefetch.py"
    script.write_text(PREFETCH)
    (trace,) = run_harness(EstimateOptions(script=script, device="cuda", timeout=300), [{}])
    assert trace["status"] == "stopped", trace["failure"]
    assert trace["breakdown"]["inputs"] >= 32 * 512 * 4


@pytest.mark.parametrize(
    ("gpu", "capability", "bf16", "bf16_native"),
    [("V100", [7, 0], True, False), ("T4", [7, 5], True, False), ("H100", [9, 0], True, True)],
)
def test_the_device_capability_is_the_targets(tmp_path, gpu, capability, bf16, bf16_native):
    # torch answers is_bf16_supported() True on a GPU without native bf16 (it emulates it) and
    # False when asked without emulation; the script sees what it would see on that GPU.
    script = tmp_path / "capability.py"
    script.write_text(CAPABILITY)
    seen = tmp_path / "seen.json"
    options = EstimateOptions(
        script=script, script_args=[str(seen)], device="cuda", gpu=find_gpu(gpu), timeout=300
    )
    (trace,) = run_harness(options, [{}])
    assert trace["status"] == "stopped", trace["failure"]
    answers = json.loads(seen.read_text())
    assert answers == {
        "capability": capability,
        "major_minor": capability,
        "bf16": bf16,
        "bf16_native": bf16_native,
    }


# What a script asks before it picks its device and precision, as Accelerate, the HF Trainer and
# Lightning do; then what it orders without asking.
WHAT_IT_SEES = """
import json, sys, warnings
import torch
seen = {
    "cuda": torch.cuda.is_available(),
    "devices": torch.cuda.device_count(),
    "accelerator": torch.accelerator.is_available(),
}
device = "cuda" if torch.cuda.is_available() else "cpu"
model = torch.nn.Linear(256, 256).to(device)
hard_coded = torch.nn.Linear(256, 256).cuda()
with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    scaler = torch.amp.GradScaler("cuda")
seen["scaler"] = scaler.is_enabled()
with open(sys.argv[1], "w") as handle:
    json.dump(seen, handle)
optimizer = torch.optim.SGD([*model.parameters(), *hard_coded.parameters()], lr=0.1)
for _ in range(2):
    hard_coded(model(torch.randn(8, 256, device=device))).sum().backward()
    optimizer.step()
"""


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_device_cpu_shows_the_script_a_machine_without_a_gpu(tmp_path, device):
    # --device cpu measures what a real CPU run holds: a script that asks whether there is a GPU
    # (Accelerator(mixed_precision="fp16") does) must take its CPU path, as on this machine.
    script = tmp_path / "what_it_sees.py"
    script.write_text(WHAT_IT_SEES)
    seen = tmp_path / "seen.json"
    prediction = estimate(
        EstimateOptions(script=script, script_args=[str(seen)], device=device, timeout=300)
    ).to_json()
    visible = device == "cuda"
    # GradScaler("cuda") on a CPU-only build: torch disables it, as a real CPU run has it.
    assert json.loads(seen.read_text()) == {
        "cuda": visible,
        "devices": 1 if visible else 0,
        "accelerator": visible,
        "scaler": visible,
    }
    # What it put on the GPU without asking still runs, on the CPU, and says so.
    kept = [note for note in prediction["corrections"] if note["name"] == "cuda-kept-on-cpu"]
    assert len(kept) == (0 if visible else 1)
    assert prediction["breakdown"]["parameters"] >= 2 * 256 * 257 * 4


# bitsandbytes' CUDA backend reads torch._C._cuda_getCurrentRawStream at import once
# torch.cuda.is_available() is True: `import peft` (and transformers' lazy imports) crashed.
RAW_STREAM = """
import torch
if torch.cuda.is_available():
    get_raw_stream = torch._C._cuda_getCurrentRawStream
model = torch.nn.Linear(8, 8).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(2):
    model(torch.randn(2, 8, device="cuda")).sum().backward()
    optimizer.step()
"""


def test_libraries_read_what_a_cuda_build_has(tmp_path):
    script = tmp_path / "raw_stream.py"
    script.write_text(RAW_STREAM)
    (trace,) = run_harness(EstimateOptions(script=script, device="cuda", timeout=300), [{}])
    assert trace["status"] == "stopped", trace["failure"]
