"""Published GPU memory measurements, reproduced config for config as scripts of our own (models
built from their configs, random data) and estimated on this CPU-only machine with
`oom-lsp estimate --device cuda --gpu GPU --format json`: published against estimated, with the error.

Each source says what it measured; the estimate's figure compared is the same kind:

* `nvidia-smi` (the process's memory on the GPU: the CUDA context, the caching allocator's reserved
  segments): the estimate's `process_bytes` (reserved + context). Goal: within 10 %.
* `max_memory_allocated` / peak active bytes: the estimate's `peak_bytes`. Goal: within 5 %.
* a published out of memory: the estimate's verdict must be "will run out of memory".

Sources (each row names its own; the configs are the sources' own, the code ours):

* Hugging Face, "Efficient Training on a Single GPU" (transformers v4.21 docs,
  https://huggingface.co/docs/transformers/v4.21.0/perf_train_gpu_one): bert-large-uncased sequence
  classification, sequences of 512 tokens, the `Trainer`, on a Tesla V100-SXM2 16GB (driver
  460.91.03, CUDA 11.2: `--cuda-version 11.2`); "GPU memory occupied" from NVML after `trainer.train()`,
  in MiB. The page measured the context alone too: 1343 MiB after `torch.ones((1, 1)).to("cuda")`,
  the row of the estimate's context table for CUDA before 11.7 (cuda_terms.py). The 8-bit Adam rows
  (bitsandbytes' CUDA kernels) are left out: no CPU trace of them.

    .venv/bin/python bench/published_gpu.py [--rows hf_vanilla,...] [--json out.json]

Not yet reproduced here (their configs are known, the scripts are not written): lit-gpt's LoRA
resource table (A100 40GB, max_memory_allocated; tutorials/resource-tables.md at Lightning-AI/litgpt)
and torchtune's Llama 3.2 3B full finetune (A100, peak active).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20
HF_SOURCE = "https://huggingface.co/docs/transformers/v4.21.0/perf_train_gpu_one"

# bert-large-uncased's config (its config.json), built with random weights.
HF_SCRIPT = """
import numpy as np
import torch
from datasets import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments, logging

logging.set_verbosity_error()
config = BertConfig(vocab_size=30522, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
                    intermediate_size=4096, max_position_embeddings=512, type_vocab_size=2, num_labels=2)
# The page's transformers (4.16, January 2022) had one attention: the eager one (scores, softmax,
# dropout kept for backward); later releases default to SDPA.
config._attn_implementation = "eager"
model = BertForSequenceClassification(config).to("cuda")
seq_len, dataset_size = 512, 512
dummy_data = {{
    "input_ids": np.random.randint(100, 30000, (dataset_size, seq_len)),
    "labels": np.random.randint(0, 1, (dataset_size)),
}}
ds = Dataset.from_dict(dummy_data)
ds.set_format("pt")
args = TrainingArguments(output_dir="tmp", num_train_epochs=1, log_level="error", report_to="none",
                         save_strategy="no", **{arguments})
Trainer(model=model, args=args, train_dataset=ds).train()
"""

# (name, TrainingArguments of the page's experiment, GPU memory occupied in MiB)
HF_ROWS = [
    ("hf_vanilla", {"per_device_train_batch_size": 4}, 14949),
    ("hf_accumulation", {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4}, 8681),
    (
        "hf_checkpointing",
        {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 4, "gradient_checkpointing": True},
        6775,
    ),
    ("hf_fp16", {"per_device_train_batch_size": 4, "fp16": True}, 13939),
    (
        "hf_checkpointing_fp16",
        {
            "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 4,
            "gradient_checkpointing": True,
            "fp16": True,
        },
        7275,
    ),
    ("hf_adafactor", {"per_device_train_batch_size": 4, "optim": "adafactor"}, 12295),
    (
        "hf_all",
        {
            "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 4,
            "gradient_checkpointing": True,
            "fp16": True,
            "optim": "adafactor",
        },
        4847,
    ),
]


def rows() -> list[dict]:
    found = []
    for name, arguments, mib in HF_ROWS:
        found.append(
            {
                "name": name,
                "source": HF_SOURCE,
                "gpu": "V100 16GB",
                "cuda": "11.2",
                "metric": "nvidia-smi",
                "published_bytes": mib * MIB,
                "config": arguments,
                "script": HF_SCRIPT.format(arguments=repr(arguments)),
            }
        )
    return found


GOALS = {"nvidia-smi": 0.10, "max_memory_allocated": 0.05, "peak active": 0.05}


def estimate(row: dict, work: Path, timeout: float) -> dict:
    folder = work / row["name"]
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "train.py"
    script.write_text(row["script"], encoding="utf-8")
    command = [
        sys.executable, "-m", "oom_lsp", "estimate", str(script), "--gpu", row["gpu"],
        "--format", "json", "--timeout", str(int(timeout)),
    ]
    if row.get("cuda"):
        command += ["--cuda-version", row["cuda"]]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=timeout + 120, check=False)
    seconds = time.perf_counter() - started
    try:
        result = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"error": (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1], "seconds": seconds}
    result["seconds_total"] = seconds
    return result


def compare(row: dict, result: dict) -> dict:
    out = {key: row[key] for key in ("name", "source", "gpu", "metric", "published_bytes", "config")}
    if "error" in result:
        return {**out, "error": result["error"]}
    figure = result["process_bytes"] if row["metric"] == "nvidia-smi" else result["peak_bytes"]
    out.update(
        estimated_bytes=figure,
        allocated_bytes=result["peak_bytes"],
        reserved_bytes=result["reserved_bytes"],
        context_bytes=result["context_bytes"],
        verdict=result.get("verdict"),
        seconds=result.get("seconds_total"),
    )
    if row["published_bytes"] is None:
        out["ok"] = result.get("verdict") == "will run out of memory"
    else:
        out["error_share"] = (figure - row["published_bytes"]) / row["published_bytes"]
        out["ok"] = abs(out["error_share"]) <= GOALS[row["metric"]]
    return out


def print_table(found: list[dict]) -> None:
    print("| row | GPU | metric | published MiB | estimated MiB | error | allocated / reserved / context MiB | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for row in found:
        published = "OOM" if row["published_bytes"] is None else f"{row['published_bytes'] / MIB:.0f}"
        if "error" in row:
            print(f"| {row['name']} | {row['gpu']} | {row['metric']} | {published} | no estimate: {row['error']} | | | |")
            continue
        error = f"{100 * row['error_share']:+.1f} %" if "error_share" in row else ""
        print(
            f"| {row['name']} | {row['gpu']} | {row['metric']} | {published} | {row['estimated_bytes'] / MIB:.0f} "
            f"| {error} | {row['allocated_bytes'] / MIB:.0f} / {row['reserved_bytes'] / MIB:.0f} / "
            f"{row['context_bytes'] / MIB:.0f} | {row['verdict']} |"
        )
    within = sum(1 for row in found if row.get("ok"))
    print(f"\nwithin the goal (10 % nvidia-smi, 5 % allocated/active, OOM rows predicted OOM): {within} of {len(found)}")
    for source in sorted({row["source"] for row in found}):
        print(f"source: {source}")


def main() -> int:
    every = rows()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default=",".join(row["name"] for row in every))
    parser.add_argument("--timeout", type=float, default=900.0)
    parser.add_argument("--json", type=Path)
    options = parser.parse_args()
    wanted = options.rows.split(",")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    found = []
    with tempfile.TemporaryDirectory(prefix="oom-lsp-published-") as tmp:
        for row in every:
            if row["name"] not in wanted:
                continue
            started = time.perf_counter()
            found.append(compare(row, estimate(row, Path(tmp), options.timeout)))
            print(f"{row['name']}: {time.perf_counter() - started:.1f} s", file=sys.stderr)
    print_table(found)
    if options.json:
        options.json.write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
