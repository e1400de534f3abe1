"""Builds the report fixtures of the golden tests with oom_lsp.profiling.report (run it to
regenerate cnn_report.json after a schema change)."""

from __future__ import annotations

import json
from pathlib import Path

from oom_lsp.profiling.oom_messages import find_ooms
from oom_lsp.profiling.report import DeviceInfo, LineUsage, ModuleUsage, OomFailure, Report, StepStats

HERE = Path(__file__).parent
SCRIPT = "/home/ana/cifar/cnn_cifar_risky.py"
MIB = 2**20


def cnn_report() -> Report:
    (oom,) = find_ooms((HERE / "cnn_oom.log").read_text())
    return Report(
        script=SCRIPT,
        status="oom",
        device=DeviceInfo("cuda", "NVIDIA GeForce RTX 3070 Laptop GPU", 0, 8_190_427_136),
        torch_version="2.5.1+cu124",
        cuda_version="12.4",
        python_version="3.11.9",
        measured_with="cuda-allocator",
        steps_requested=3,
        steps=[
            StepStats(1, 2_961 * MIB, 3_100 * MIB, 0.41),
            StepStats(2, 5_022 * MIB, 5_200 * MIB, 0.39),
            StepStats(3, 7_190 * MIB, 7_500 * MIB, 0.40, complete=False),
        ],
        peak_allocated=7_190 * MIB,
        peak_reserved=7_500 * MIB,
        top_lines=[
            LineUsage(SCRIPT, 107, 4_130 * MIB, "<module>", "total_loss += loss", 1_204),
            LineUsage(SCRIPT, 102, 1_850 * MIB, "<module>", "outputs = net(inputs)", 96),
            LineUsage(
                SCRIPT, 58, 1_020 * MIB, "forward", "x = self.pool(F.relu(self.bn1(self.conv1(x))))", 12
            ),
            LineUsage(SCRIPT, 104, 190 * MIB, "<module>", "loss.backward()", 40),
        ],
        top_modules=[
            ModuleUsage("Net.conv1", "Conv2d", 980 * MIB),
            ModuleUsage("Net.bn1", "BatchNorm2d", 490 * MIB),
            ModuleUsage("Net.fc1", "Linear", 64 * MIB),
        ],
        batch_size=512,
        input_shape=[512, 3, 32, 32],
        oom=OomFailure(oom, {"allocated": 7_190 * MIB, "reserved": 7_500 * MIB}, step=3),
        wall_time=2.4,
    )


def gpt_estimate() -> dict[str, object]:
    script = "/home/ana/gpt/gpt_naive_attention_risky.py"
    return {
        "script": script,
        "device": "cuda",
        "batch_size": 8,
        "peak_bytes": 31_400 * MIB,
        "breakdown": {
            "parameters": 1_350 * MIB,
            "gradients": 1_350 * MIB,
            "optimizer_state": 2_700 * MIB,
            "activations": 25_900 * MIB,
            "workspaces": 40 * MIB,
        },
        "reserved_bytes": 32_000 * MIB,
        "context_bytes": 400 * MIB,
        "process_bytes": 32_400 * MIB,
        "peak_at": {
            "op": "aten::softmax",
            "module": "GPT.transformer.h.23.attn",
            "phase": "forward",
            "file": script,
            "line": 46,
        },
        "top_modules": [["GPT.transformer.h.0.attn", 1_030 * MIB], ["GPT.transformer.h.1.attn", 1_030 * MIB]],
        "top_lines": [
            [f"{script}:46", 12_288 * MIB],
            [f"{script}:44", 6_144 * MIB],
            [f"{script}:47", 3_072 * MIB],
        ],
        "gpu": {"name": "NVIDIA GeForce RTX 4090", "memory": 25_757_220_864},
        "verdict": "will run out of memory",
        "corrections": [],
        "steps_traced": 2,
        "seconds": 41.0,
        "method": "fake-tensor trace of two optimizer steps",
        "torch": "2.5.1",
        "batch_knobs": [],
    }


if __name__ == "__main__":
    cnn_report().write(HERE / "cnn_report.json")
    (HERE / "gpt_estimate.json").write_text(json.dumps(gpt_estimate(), indent=2) + "\n")
