"""Measures this machine's CUDA terms for `oom-lsp calibrate`: run by path in the user's interpreter
(standard library and torch only, nothing of oom_lsp), the result written as JSON to --out.

    <python> .../oom_lsp/estimate/calibrate_probe.py --out calibration.json [--dry-run]

What it measures, in this order, in a fresh process (each number is what the estimate would
otherwise take from its tables):

1. the caching allocator's segments: the reserved memory a 1 KiB, a 4 MiB and a 24 MiB request add;
2. the cuBLAS workspace: what the first matrix product (cuBLAS) and the first one with a bias
   (cuBLASLt) allocate beyond their outputs;
3. a tiny training step (linear and convolution layers, scaled dot-product attention, AdamW), so that
   the kernels a training step loads lazily are loaded;
4. the CUDA context: the process's memory as nvidia-smi reports it, less what PyTorch reserved; without
   nvidia-smi (or where it cannot see the process), the device's used memory from `cudaMemGetInfo`
   less what PyTorch reserved (other processes on the GPU then count too; the result says which).

`--dry-run` runs the same code on the CPU, where the counters read 0: nothing is measured, but every
step runs (the tests use it on machines without a GPU). Without a CUDA device and without --dry-run:
exit 4 and one line on stderr.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys

NO_TORCH_EXIT = 3
NO_DEVICE_EXIT = 4
MIB = 2**20


class Counters:
    """The caching allocator's counters, or zeros on the CPU (--dry-run)."""

    def __init__(self, torch, cuda: bool):
        self.torch = torch
        self.cuda = cuda

    def allocated(self) -> int:
        return self.torch.cuda.memory_allocated() if self.cuda else 0

    def reserved(self) -> int:
        return self.torch.cuda.memory_reserved() if self.cuda else 0

    def synchronize(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()


def segments(torch, device: str, counters: Counters) -> dict:
    """The reserved memory each request size adds to an empty allocator."""
    if counters.cuda:
        torch.cuda.empty_cache()
    found = {}
    kept = []
    for name, size in (("small_segment", 1024), ("medium_segment", 4 * MIB), ("large_request_24mib", 24 * MIB)):
        before = counters.reserved()
        kept.append(torch.empty(size, dtype=torch.uint8, device=device))
        counters.synchronize()
        found[name] = counters.reserved() - before
    del kept
    return found


def cublas_workspace(torch, device: str, counters: Counters) -> dict:
    """What the first cuBLAS and cuBLASLt calls allocate beyond their outputs (kept for the process)."""
    a = torch.randn(64, 64, device=device)
    b = torch.randn(64, 64, device=device)
    bias = torch.randn(64, device=device)
    counters.synchronize()
    before = counters.allocated()
    product = a @ b
    counters.synchronize()
    plain = counters.allocated() - before - _rounded(product)
    before = counters.allocated()
    with_bias = torch.nn.functional.linear(a, b, bias)
    counters.synchronize()
    lt = counters.allocated() - before - _rounded(with_bias)
    return {"cublas": max(plain, 0), "cublaslt": max(lt, 0)}


def _rounded(tensor) -> int:
    nbytes = tensor.numel() * tensor.element_size()
    return -(-nbytes // 512) * 512


def training_step(torch, device: str) -> None:
    """A step of the layers most scripts have, so that their kernels are loaded."""
    nn = torch.nn
    model = nn.ModuleDict(
        {
            "conv": nn.Conv2d(3, 16, 3, padding=1),
            "norm": nn.LayerNorm(64),
            "proj": nn.Linear(64, 192),
            "out": nn.Linear(64, 10),
        }
    ).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        image = torch.randn(4, 3, 8, 8, device=device)
        tokens = model["conv"](image).flatten(2).transpose(1, 2)  # 4 x 64 x 16
        tokens = model["norm"](tokens.reshape(4, 16, 64))
        q, k, v = model["proj"](tokens).view(4, 16, 3, 4, 16).permute(2, 0, 3, 1, 4)
        attended = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        logits = model["out"](attended.transpose(1, 2).reshape(4, 16, 64))
        loss = nn.functional.cross_entropy(logits.reshape(-1, 10), torch.randint(0, 10, (64,), device=device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def _nvidia_smi(*query: str) -> list[str]:
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        done = subprocess.run(
            ["nvidia-smi", *query, "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in done.stdout.splitlines() if line.strip()] if done.returncode == 0 else []


def context(torch, counters: Counters) -> tuple[int, str]:
    """The process's memory outside PyTorch's allocator."""
    if not counters.cuda:
        return 0, "dry run: nothing measured"
    counters.synchronize()
    reserved = counters.reserved()
    for line in _nvidia_smi("--query-compute-apps=pid,used_memory"):
        pid, _, used = line.partition(",")
        if pid.strip() == str(os.getpid()) and used.strip().isdigit():
            return int(used) * MIB - reserved, "nvidia-smi's memory of this process less PyTorch's reserved memory"
    free, total = torch.cuda.mem_get_info()
    return total - free - reserved, (
        "the device's used memory (cudaMemGetInfo) less PyTorch's reserved memory: nvidia-smi did not list "
        "this process; other processes on the GPU are counted too"
    )


def measure(torch, dry_run: bool) -> dict:
    cuda = not dry_run
    device = "cuda" if cuda else "cpu"
    counters = Counters(torch, cuda)
    if cuda:
        properties = torch.cuda.get_device_properties(0)
        device_info = {
            "name": properties.name,
            "total_memory": int(properties.total_memory),
            "capability": [properties.major, properties.minor],
        }
    else:
        device_info = {"name": "CPU (dry run)", "total_memory": 0, "capability": None}
    found_segments = segments(torch, device, counters)
    workspace = cublas_workspace(torch, device, counters)
    training_step(torch, device)
    context_bytes, method = context(torch, counters)
    driver = (_nvidia_smi("--query-gpu=driver_version") or [None])[0] if cuda else None
    loading = os.environ.get("CUDA_MODULE_LOADING")
    version = torch.version.cuda
    major_minor = tuple(int(part) for part in version.split(".")[:2]) if version else None
    return {
        "dry_run": dry_run,
        "device": device_info,
        "driver": driver,
        "cuda": version,
        "torch": torch.__version__,
        "module_loading": loading,
        "lazy_loading": bool(major_minor and major_minor >= (11, 7) and (loading or "LAZY").upper() == "LAZY"),
        "context_bytes": int(context_bytes),
        "context_method": method,
        "cublas_workspace_bytes": int(workspace["cublas"] + workspace["cublaslt"]),
        "cublas_workspaces": workspace,
        "allocator": found_segments,
        "allocator_config": os.environ.get("PYTORCH_CUDA_ALLOC_CONF"),
        "measured_at": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description="Measure this machine's CUDA terms for oom-lsp.")
    parser.add_argument("--out", required=True)
    parser.add_argument("--dry-run", action="store_true", help="run every step on the CPU; measure nothing")
    options = parser.parse_args()
    try:
        import torch
    except ImportError:
        sys.stderr.write(f"{sys.executable} cannot import torch\n")
        return NO_TORCH_EXIT
    if not options.dry_run and not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, but no GPU visible"
        sys.stderr.write(f"{sys.executable} has torch {torch.__version__} ({build})\n")
        return NO_DEVICE_EXIT
    result = measure(torch, options.dry_run)
    with open(options.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main())
