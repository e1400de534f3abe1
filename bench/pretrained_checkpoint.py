"""`oom-lsp estimate` on a script that loads a big pretrained checkpoint, against loading it for real.

Writes a Llama-style checkpoint of a big config under bench/.work/pretrained/<config>/ (config.json
from `save_pretrained`, model.safetensors whose header is real and whose tensor data is a sparse
hole: several GB that take no disk and read as zeros), a training script that loads it with
`AutoModelForCausalLM.from_pretrained(folder, dtype=...)` ("auto" unless --dtype) and takes two
AdamW steps on the GPU, then prints, each in a fresh process:

- estimate: `oom-lsp estimate train.py --gpu H100 --format json` (the harness reads the header
  only);
- real load: `from_pretrained` of the same folder for real, each weight then read once (as `.cuda()`
  or a first forward reads it: a load alone leaves them memory-mapped); no training step. The page
  cache serves a sparse file's zeros without the disk: a lower bound of a real load's time.

For each: wall seconds, CPU seconds and the peak RSS of the process and its descendants
(RUSAGE_CHILDREN); for the estimate, also its trace's seconds (the script's start to its second step).

    .venv/bin/python bench/pretrained_checkpoint.py                      # TinyLlama-1.1B's shape, 2.2 GB
    .venv/bin/python bench/pretrained_checkpoint.py --dtype float32                  # cast on load
    .venv/bin/python bench/pretrained_checkpoint.py --config llama-8b --skip-real   # 16 GB, estimate only
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "bench" / ".work" / "pretrained"
GIB = 2**30

CONFIGS = {
    # TinyLlama-1.1B's shape (1.1 B parameters, 2.2 GB in bfloat16).
    "tinyllama-1.1b": {
        "vocab_size": 32000,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 22,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
    },
    # Llama-3-8B's shape (8.0 B parameters, 16 GB in bfloat16).
    "llama-8b": {
        "vocab_size": 128256,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
    },
}

TRAIN = """import sys
import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=sys.argv[2]).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
for _ in range(2):
    ids = torch.randint(0, model.config.vocab_size, (1, 256), device="cuda")
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""

# The weights are memory-mapped until used: each is read once here, as `.cuda()` or a first forward would.
LOAD = """import sys
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=sys.argv[2])
print(sum(float(p.sum()) for p in model.parameters()))
"""

DTYPE_NAMES = {"torch.bfloat16": "BF16", "torch.float16": "F16", "torch.float32": "F32"}


def write_checkpoint(name: str) -> tuple[Path, int]:
    """config.json and a sparse model.safetensors (real header, a hole for the data); its data bytes."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = WORK / name / "checkpoint"
    config = LlamaConfig(**CONFIGS[name], tie_word_embeddings=False, dtype="bfloat16")
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for key, tensor in model.state_dict().items():
        size = tensor.numel() * tensor.element_size()
        header[key] = {
            "dtype": DTYPE_NAMES[str(tensor.dtype)],
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    config.save_pretrained(folder)
    path = folder / "model.safetensors"
    with path.open("wb") as handle:
        handle.write(struct.pack("<Q", len(text)))
        handle.write(text)
    os.truncate(path, 8 + len(text) + offset)
    return folder, offset


def timed(command: list[str], cwd: Path) -> dict:
    """Wall seconds, peak RSS (the process and every descendant it waited for) and the output."""
    started = time.perf_counter()
    process = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = process.communicate()
    seconds = time.perf_counter() - started
    # The largest RSS of every process this one reaped, their own reaped children included: each run
    # is measured from a bench process of its own (`measure`), so that this is that run's peak.
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {
        "seconds": seconds,
        "cpu_seconds": usage.ru_utime + usage.ru_stime,
        "peak_rss": usage.ru_maxrss * 1024,
        "returncode": process.returncode,
        "stdout": stdout,
        "stderr": stderr,
    }


def measure(kind: str, folder: Path, python: str, dtype: str) -> dict:
    """One measurement in a fresh bench process, so that RUSAGE_CHILDREN holds that run alone."""
    output = subprocess.run(
        [
            sys.executable,
            __file__,
            "--measure",
            kind,
            "--folder",
            str(folder),
            "--python",
            python,
            "--dtype",
            dtype,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(output.stdout.splitlines()[-1])


def _measure_one(kind: str, folder: Path, python: str, dtype: str) -> None:
    work = folder.parent
    if kind == "estimate":
        (work / "train.py").write_text(TRAIN)
        oom_lsp = Path(python).with_name("oom-lsp")
        command = [
            str(oom_lsp),
            "estimate",
            "train.py",
            "--gpu",
            "H100",
            "--format",
            "json",
            "--",
            str(folder),
            dtype,
        ]
    else:
        (work / "load.py").write_text(LOAD)
        command = [python, "load.py", str(folder), dtype]
    result = timed(command, work)
    # oom-lsp estimate exits 1 when the step does not fit the GPU: a prediction all the same.
    if result["returncode"] not in ((0, 1) if kind == "estimate" else (0,)):
        print(result["stderr"][-3000:], file=sys.stderr)
        raise SystemExit(f"{kind} failed with code {result['returncode']}")
    row = {key: result[key] for key in ("seconds", "cpu_seconds", "peak_rss")}
    if kind == "estimate":
        prediction = json.loads(result["stdout"])
        row.update(
            trace_seconds=prediction["seconds"],
            peak_bytes=prediction["peak_bytes"],
            parameters=prediction["breakdown"]["parameters"],
        )
    print(json.dumps(row))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(CONFIGS), default="tinyllama-1.1b")
    parser.add_argument("--python", default=sys.executable, help="the interpreter the script runs in")
    parser.add_argument(
        "--dtype",
        default="auto",
        help='from_pretrained(dtype=...): "auto" keeps the bfloat16 of the checkpoint, "float32" casts on load',
    )
    parser.add_argument("--skip-real", action="store_true", help="do not load the checkpoint for real")
    parser.add_argument("--measure", choices=["estimate", "real"], help=argparse.SUPPRESS)
    parser.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.measure:
        _measure_one(options.measure, options.folder, options.python, options.dtype)
        return 0

    folder, data_bytes = write_checkpoint(options.config)
    file_size = (folder / "model.safetensors").stat().st_size
    on_disk = (folder / "model.safetensors").stat().st_blocks * 512
    print(
        f"{options.config}, dtype={options.dtype}: model.safetensors {file_size / GIB:.2f} GiB ({data_bytes / GIB:.2f} GiB of tensor "
        f"data, {on_disk / 2**20:.2f} MiB on disk: a sparse file)"
    )
    rows = [("estimate (header only)", measure("estimate", folder, options.python, options.dtype))]
    if not options.skip_real:
        rows.append(("from_pretrained for real", measure("real", folder, options.python, options.dtype)))
    print("| run | wall s | CPU s | trace s | peak RSS GiB | estimate: parameters GiB | estimate: peak GiB |")
    print("|---|---|---|---|---|---|---|")
    for name, row in rows:
        trace = f"{row['trace_seconds']:.1f}" if "trace_seconds" in row else ""
        parameters = f"{row['parameters'] / GIB:.2f}" if "parameters" in row else ""
        peak = f"{row['peak_bytes'] / GIB:.2f}" if "peak_bytes" in row else ""
        print(
            f"| {name} | {row['seconds']:.1f} | {row['cpu_seconds']:.1f} | {trace} | {row['peak_rss'] / GIB:.2f} "
            f"| {parameters} | {peak} |"
        )
    print(f"tensor data in the checkpoint: {data_bytes / GIB:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
