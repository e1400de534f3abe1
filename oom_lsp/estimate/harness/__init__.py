"""The child side of `oom-lsp estimate`: runs a user's training script, unchanged,
in the user's interpreter, and measures the peak memory of its first two
optimizer steps.

It imports torch and nothing else of oom_lsp: the user's interpreter need not
have oom-lsp installed. It is started by path, never by module name:

    <python> .../oom_lsp/estimate/harness/__main__.py --request request.json

and `__main__.py` loads this folder as a package under a private name
(`_oom_lsp_estimate_harness`), so that its modules (`tracker`, `data`, ...)
never meet the user's own modules of the same names, and takes its folder off
`sys.path`: the script sees the `sys.path`, `sys.argv` and `__main__` it would
see when run as `python train.py`. Modules here import each other relatively.

One module per concern:

- `runner`: the request, one run of the script under the shims, its result; `main`.
- `tracker`: the live-storage tracker (a TorchDispatchMode) and what it counts.
- `context`: where the script is (phase, module, line) when a storage is made.
- `modules`: which module, found without holding anything alive (no graph hooks).
- `memo`: FakeDispatchMemo, the cache of fake dispatches.
- `fakes`: the run's FakeTensorMode, and deep copies of its tensors.
- `shims`: the patcher that every shim goes through, and their order.
- `cuda`: the GPU the script believes it has, or none under `--device cpu` (torch.cuda,
  torch.accelerator, `device="cuda"`, autocast, GradScaler).
- `cuda_kernels`: CUDA's kernel choices emulated on the CPU trace (SDPA, cuDNN RNN reserve).
- `cpu_kernels`: what CPU kernels allocate inside themselves (oneDNN scratch and workspaces, the
  operand copies of matrix products, the elementwise buffer a reduced loss keeps).
- `training`: the training step's phases, parameters, gradients, optimizer state, the stop.
- `data`: DataLoader in-process, each batch it yields handed on as fake tensors (`BatchTrace`).
- `seeding`: the seeds of a run (random, NumPy, torch, each DataLoader's shuffle).
- `values`: values read from fake tensors (`f"{loss:.4f}"`, `.tolist()`).
- `pretrained`: checkpoints opened by their safetensors headers under fake mode; offline runs.
- `knobs`: where the script sets its batch size (argparse, module globals, TrainingArguments, Lightning), the `--batch-size` override, `run_script`.
- `quantized`: the quantized layers the script builds (bitsandbytes...), named when the run falls back.
- `failures`: how a failed run is explained (the user's frames, the kind of failure).
- `progress`: progress events to the parent.
- `common`: small helpers the others share.
"""
