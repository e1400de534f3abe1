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

* lit-gpt's LoRA resource table (tutorials/resource-tables.md of Lightning-AI/litgpt, PyTorch 2.1 and
  Lit-GPT commit 8641822): phi-1.5, StableLM Alpha 3B, Llama 2 7B and 13B, bf16-true, LoRA on query
  and value, on one A100 40GB; "Max GPU RAM" = max_memory_allocated / 1e9, and its OOM rows.

* torchtune's README, "Optimization flags" (https://github.com/pytorch/torchtune, README.md): Llama 3.2 3B,
  full_finetune_single_device, batch 2, max sequence length 4096, bf16, one A100 (80GB: the figures pass
  40 GiB); "Peak Memory Active (GiB)". Only the "+ Packed Dataset" row (60.0 GiB) is reproduced: it runs
  eagerly with fixed shapes (2 x 4096 packed tokens, FlexAttention with a document mask on sm >= 7.5).
  Left out: the baseline (Alpaca padded to each batch's longest example: the lengths are the data's), and
  the rows after it, which add torch.compile (its fused kernels are not what an eager trace runs).
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

LITGPT_SOURCE = (
    "https://github.com/Lightning-AI/litgpt/blob/bc35e1b7/tutorials/resource-tables.md "
    "(Lit-GPT commit 8641822, PyTorch 2.1)"
)

# Lit-GPT's GPT (lit_gpt/model.py, lit_gpt/lora.py at 8641822) written again from its description:
# fused qkv with LoRA on query and value (r 8, alpha 16, dropout 0.05, finetune/lora.py's defaults),
# RoPE on the first rope_n_elem channels, causal SDPA (no flash_attn package), LayerNorm or RMSNorm
# (computed in the model's dtype), GPT-NeoX (GELU) or LLaMA (SwiGLU) MLP, parallel or sequential
# residual, the lm_head applied in chunks of 128 tokens and a chunked cross entropy. bf16-true: every
# weight in bfloat16. One micro-batch of the longest Alpaca example per step, as the table's runs
# peak on it (get_batch pads to the longest sequence of the micro-batch).
LITGPT_SCRIPT = """
import math
import torch
import torch.nn as nn
import torch.nn.functional as F

cfg = {config!r}
micro_batch_size, seq_len = {micro_batch_size}, {seq_len}
r, alpha, lora_dropout = 8, 16, 0.05
head_size = cfg["n_embd"] // cfg["n_head"]
rope_n_elem = int(cfg["rotary_percentage"] * head_size)


class RMSNorm(nn.Module):
    def __init__(self, size, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        norm_x = torch.mean(x * x, dim=-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(norm_x + self.eps))


def norm():
    return RMSNorm(cfg["n_embd"]) if cfg["rmsnorm"] else nn.LayerNorm(cfg["n_embd"], eps=1e-5)


class LoRAQKV(nn.Module):
    def __init__(self):
        super().__init__()
        c = cfg["n_embd"]
        self.linear = nn.Linear(c, 3 * c, bias=cfg["bias"])
        self.lora_A = nn.Parameter(torch.zeros(2 * r, c))
        self.lora_B = nn.Parameter(torch.zeros(2 * c, r))
        self.dropout = nn.Dropout(lora_dropout)

    def forward(self, x):
        pretrained = self.linear(x)
        after_a = F.linear(self.dropout(x), self.lora_A)
        # lit-gpt's grouped conv1d: each enabled matrix gets its own r columns of A and rows of B
        after_b = F.conv1d(after_a.transpose(-2, -1), self.lora_B.unsqueeze(-1), groups=2).transpose(-2, -1)
        c = cfg["n_embd"]
        # zero_pad: the lora output placed at the query and value columns of a full-size zero tensor
        padded = after_b.new_zeros((*after_b.shape[:-1], 3 * c))
        padded = padded.index_copy(-1, torch.cat([torch.arange(c), torch.arange(2 * c, 3 * c)]).to(x.device), after_b)
        return pretrained + padded * (alpha / r)


def apply_rope(x, cos, sin):
    half = x.size(-1) // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return ((x * cos) + (rotated * sin)).type_as(x)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        c = cfg["n_embd"]
        self.norm_1 = norm()
        self.norm_2 = None if cfg["shared_attention_norm"] else norm()
        self.attn = LoRAQKV()
        self.proj = nn.Linear(c, c, bias=cfg["bias"])
        if cfg["llama_mlp"]:
            self.fc_1 = nn.Linear(c, cfg["intermediate_size"], bias=cfg["bias"])
            self.fc_2 = nn.Linear(c, cfg["intermediate_size"], bias=cfg["bias"])
        else:
            self.fc = nn.Linear(c, cfg["intermediate_size"], bias=cfg["bias"])
        self.mlp_proj = nn.Linear(cfg["intermediate_size"], c, bias=cfg["bias"])

    def mlp(self, x):
        if cfg["llama_mlp"]:
            return self.mlp_proj(F.silu(self.fc_1(x)) * self.fc_2(x))
        return self.mlp_proj(F.gelu(self.fc(x), approximate=cfg["gelu_approximate"]))

    def attention(self, x, cos, sin):
        B, T, C = x.size()
        qkv = self.attn(x).view(B, T, cfg["n_head"], 3, head_size).permute(0, 2, 3, 1, 4)
        q, k, v = qkv.split((1, 1, 1), dim=2)
        q, k, v = (t.reshape(B, -1, T, head_size) for t in (q, k, v))
        q = torch.cat((apply_rope(q[..., :rope_n_elem], cos, sin), q[..., rope_n_elem:]), dim=-1)
        k = torch.cat((apply_rope(k[..., :rope_n_elem], cos, sin), k[..., rope_n_elem:]), dim=-1)
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0, scale=1.0 / math.sqrt(head_size), is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x, cos, sin):
        n_1 = self.norm_1(x)
        h = self.attention(n_1, cos, sin)
        if cfg["parallel_residual"]:
            n_2 = n_1 if cfg["shared_attention_norm"] else self.norm_2(x)
            return x + h + self.mlp(n_2)
        x = x + h
        return x + self.mlp(self.norm_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(cfg["padded_vocab_size"], cfg["n_embd"])
        self.h = nn.ModuleList(Block() for _ in range(cfg["n_layer"]))
        self.ln_f = norm()
        self.lm_head = nn.Linear(cfg["n_embd"], cfg["padded_vocab_size"], bias=cfg["lm_head_bias"])
        theta = 1.0 / (10000 ** (torch.arange(0, rope_n_elem, 2).float() / rope_n_elem))
        idx_theta = torch.outer(torch.arange(cfg["block_size"]).float(), theta).repeat(1, 2)
        self.register_buffer("cos", torch.cos(idx_theta), persistent=False)
        self.register_buffer("sin", torch.sin(idx_theta), persistent=False)

    def forward(self, idx):
        T = idx.size(1)
        cos, sin = self.cos[:T], self.sin[:T]
        x = self.wte(idx)
        for block in self.h:
            x = block(x, cos, sin)
        x = self.ln_f(x)
        return [self.lm_head(x_i) for x_i in x.split(128, dim=1)]


def chunked_cross_entropy(logits, targets):
    logits = [chunk.reshape(-1, chunk.size(-1)) for chunk in logits]
    targets = [chunk.reshape(-1) for chunk in targets.split(128, dim=1)]
    losses = [F.cross_entropy(l, t, ignore_index=-1, reduction="none") for l, t in zip(logits, targets)]
    return torch.cat(losses).sum() / (targets[0].numel() * len(targets))


torch.set_default_dtype(torch.bfloat16)
model = GPT().to("cuda")
for name, parameter in model.named_parameters():
    parameter.requires_grad = "lora_" in name
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4, weight_decay=0.01)
for step in range(2):
    input_ids = torch.randint(0, cfg["vocab_size"], (micro_batch_size, seq_len), device="cuda")
    targets = torch.randint(0, cfg["vocab_size"], (micro_batch_size, seq_len), device="cuda")
    logits = model(input_ids)
    loss = chunked_cross_entropy(logits, targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""

_LLAMA = dict(rmsnorm=True, llama_mlp=True, bias=False, lm_head_bias=False, parallel_residual=False,
              shared_attention_norm=False, rotary_percentage=1.0, vocab_size=32000, padded_vocab_size=32000,
              block_size=4096, gelu_approximate="none")
# lit_gpt/config.py at 8641822; block_size is the rope cache's length (the model's context)
LITGPT_MODELS = {
    "phi-1.5": (dict(_LLAMA, rmsnorm=False, llama_mlp=False, bias=True, lm_head_bias=True, parallel_residual=True,
                     shared_attention_norm=True, rotary_percentage=0.5, vocab_size=50257, padded_vocab_size=51200,
                     block_size=2048, n_layer=24, n_embd=2048, n_head=32, intermediate_size=8192,
                     gelu_approximate="tanh"), 1044),
    "stablelm-alpha-3b": (dict(_LLAMA, rmsnorm=False, llama_mlp=False, bias=True, parallel_residual=True,
                               rotary_percentage=0.25, vocab_size=50254, padded_vocab_size=50688, n_layer=16,
                               n_embd=4096, n_head=32, intermediate_size=16384), 1034),
    "llama-2-7b": (dict(_LLAMA, n_layer=32, n_embd=4096, n_head=32, intermediate_size=11008), 1304),
    "llama-2-13b": (dict(_LLAMA, n_layer=40, n_embd=5120, n_head=40, intermediate_size=13824), 1304),
}
# (row, model, micro-batch, "Max GPU RAM" in GB = max_memory_allocated / 1e9, None for OOM); the
# bnb.nf4 rows are left out (bitsandbytes' CUDA kernels: no CPU trace of them)
LITGPT_ROWS = [
    ("litgpt_phi_mb1", "phi-1.5", 1, 4.82),
    ("litgpt_phi_mb2", "phi-1.5", 2, 6.76),
    ("litgpt_phi_mb4", "phi-1.5", 4, 10.68),
    ("litgpt_stablelm_mb1", "stablelm-alpha-3b", 1, 9.69),
    ("litgpt_stablelm_mb2", "stablelm-alpha-3b", 2, 12.10),
    ("litgpt_stablelm_mb4", "stablelm-alpha-3b", 4, 16.92),
    ("litgpt_llama2_7b_mb1", "llama-2-7b", 1, 21.30),
    ("litgpt_llama2_7b_mb2", "llama-2-7b", 2, 29.07),
    ("litgpt_llama2_7b_mb4", "llama-2-7b", 4, None),
    ("litgpt_llama2_13b_mb1", "llama-2-13b", 1, 38.12),
    ("litgpt_llama2_13b_mb2", "llama-2-13b", 2, None),
    ("litgpt_llama2_13b_mb4", "llama-2-13b", 4, None),
]


TORCHTUNE_SOURCE = "https://github.com/pytorch/torchtune/blob/main/README.md#optimization-flags (+ Packed Dataset)"

# torchtune's Llama 3.2 3B (torchtune/models/llama3_2, modules/transformer.py, attention.py,
# rms_norm.py, position_embeddings.py) written again: separate q/k/v projections, GQA with k and v
# expanded to the query heads, RoPE on fp32 copies at the packed positions, RMSNorm in fp32, SwiGLU,
# tied output projection with logits cast to fp32 (TransformerDecoder.unembed), the recipe's shifted
# labels and CrossEntropyLoss over all logits, fused AdamW in bf16. Packed samples of several documents:
# FlexAttention with a document-causal block mask where the GPU is sm >= 7.5, as torchtune does.
TORCHTUNE_SCRIPT = """import torch
import torch.nn as nn
import torch.nn.functional as F

vocab, dim, n_layers, n_heads, n_kv_heads, hidden = 128256, 3072, 28, 24, 8, 8192
head_dim = dim // n_heads
batch_size, max_seq_len = 2, 4096
USE_FLEX = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (7, 5)
if USE_FLEX:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention


class RMSNorm(nn.Module):
    def __init__(self, size, eps=1e-5):
        super().__init__()
        self.eps, self.scale = eps, nn.Parameter(torch.ones(size))

    def forward(self, x):
        x_fp32 = x.float()
        normed = (x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
        return normed * self.scale


class RoPE(nn.Module):
    def __init__(self):
        super().__init__()
        theta = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2)[: head_dim // 2].float() / head_dim))
        angles = torch.outer(torch.arange(131072 // 16, dtype=torch.float32), theta).float()
        self.register_buffer("cache", torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1), persistent=False)

    def forward(self, x, input_pos):
        rope = self.cache[input_pos].view(-1, x.size(1), 1, x.size(3) // 2, 2)
        xs = x.float().reshape(*x.shape[:-1], -1, 2)
        out = torch.stack([xs[..., 0] * rope[..., 0] - xs[..., 1] * rope[..., 1],
                           xs[..., 1] * rope[..., 0] + xs[..., 0] * rope[..., 1]], -1)
        return out.flatten(3).type_as(x)


class Attention(nn.Module):
    def __init__(self, rope):
        super().__init__()
        self.q_proj = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.output_proj = nn.Linear(dim, dim, bias=False)
        self.rope = rope

    def forward(self, x, mask, input_pos):
        b, s, _ = x.shape
        q = self.rope(self.q_proj(x).view(b, s, -1, head_dim), input_pos).transpose(1, 2)
        k = self.rope(self.k_proj(x).view(b, s, -1, head_dim), input_pos).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, head_dim).transpose(1, 2)
        expand = (b, n_kv_heads, n_heads // n_kv_heads, -1, head_dim)
        k = k.unsqueeze(2).expand(expand).flatten(1, 2)
        v = v.unsqueeze(2).expand(expand).flatten(1, 2)
        if USE_FLEX:
            y = flex_attention(q, k, v, block_mask=mask)
        else:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.output_proj(y.transpose(1, 2).contiguous().view(b, s, -1))


class Layer(nn.Module):
    def __init__(self, rope):
        super().__init__()
        self.sa_norm, self.mlp_norm, self.attn = RMSNorm(dim), RMSNorm(dim), Attention(rope)
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x, mask, input_pos):
        h = self.attn(self.sa_norm(x), mask, input_pos) + x
        m = self.mlp_norm(h)
        return h + self.w2(F.silu(self.w1(m)) * self.w3(m))


class Llama(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        rope = RoPE()
        self.layers = nn.ModuleList(Layer(rope) for _ in range(n_layers))
        self.norm = RMSNorm(dim)

    def forward(self, tokens, mask, input_pos):
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, mask, input_pos)
        return F.linear(self.norm(h), self.tok_embeddings.weight).float()


torch.set_default_dtype(torch.bfloat16)
model = Llama().to("cuda")
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)
loss_fn = nn.CrossEntropyLoss(ignore_index=-100)
documents = [1500, 1200, 900, 496]
document_ids = torch.cat([torch.full((n,), i) for i, n in enumerate(documents)]).repeat(batch_size, 1).to("cuda")
input_pos = torch.cat([torch.arange(n) for n in documents]).repeat(batch_size, 1).to("cuda")
if USE_FLEX:
    def document_causal(b, h, q_idx, kv_idx):
        return (document_ids[b, q_idx] == document_ids[b, kv_idx]) & (q_idx >= kv_idx)
    mask = create_block_mask(document_causal, batch_size, None, max_seq_len, max_seq_len, device="cuda")
else:
    mask = None
for step in range(2):
    tokens = torch.randint(0, vocab, (batch_size, max_seq_len), device="cuda")
    labels = torch.randint(0, vocab, (batch_size, max_seq_len), device="cuda")
    logits = model(tokens, mask, input_pos)
    labels = torch.hstack((labels[..., 1:], torch.full((batch_size, 1), -100, device="cuda")))
    loss = loss_fn(logits.reshape(-1, logits.size(-1)), labels.reshape(-1))
    del logits
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
"""
# (row, "Peak Memory Active (GiB)")
TORCHTUNE_ROWS = [("torchtune_llama32_3b_packed", 60.0)]

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
    for name, model, micro_batch_size, gb in LITGPT_ROWS:
        config, seq_len = LITGPT_MODELS[model]
        found.append(
            {
                "name": name,
                "source": LITGPT_SOURCE,
                "gpu": "A100 40GB",
                "metric": "max_memory_allocated",
                "published_bytes": None if gb is None else int(gb * 1e9),
                "config": {"model": model, "micro_batch_size": micro_batch_size, "seq_len": seq_len},
                "script": LITGPT_SCRIPT.format(config=config, micro_batch_size=micro_batch_size, seq_len=seq_len),
            }
        )
    for name, gib in TORCHTUNE_ROWS:
        found.append(
            {
                "name": name,
                "source": TORCHTUNE_SOURCE,
                "gpu": "A100 80GB",
                "metric": "peak active",
                "published_bytes": int(gib * 2**30),
                "config": {"model": "llama3_2_3b", "batch_size": 2, "max_seq_len": 4096, "packed": True},
                "script": TORCHTUNE_SCRIPT,
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
