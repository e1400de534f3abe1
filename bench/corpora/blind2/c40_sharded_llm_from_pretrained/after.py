"""LLaMA-style decoder used for SFT; from_pretrained reads the sharded pytorch_model-*.bin files
written by train_sft.py at the end of a run."""
import json
import os

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class DecoderLayer(nn.Module):
    def __init__(self, dim, n_heads, ffn_dim):
        super().__init__()
        self.n_heads = n_heads
        self.q_proj, self.k_proj = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.v_proj, self.o_proj = nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim, bias=False)
        self.gate_proj, self.up_proj = nn.Linear(dim, ffn_dim, bias=False), nn.Linear(dim, ffn_dim, bias=False)
        self.down_proj = nn.Linear(ffn_dim, dim, bias=False)
        self.input_layernorm, self.post_attention_layernorm = RMSNorm(dim), RMSNorm(dim)

    def forward(self, x):
        B, T, C = x.shape
        h = self.input_layernorm(x)
        q, k, v = (p(h).view(B, T, self.n_heads, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, C)
        x = x + self.o_proj(a)
        h = self.post_attention_layernorm(x)
        return x + self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class LlamaLike(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config["vocab_size"], config["hidden_size"])
        self.layers = nn.ModuleList([
            DecoderLayer(config["hidden_size"], config["num_attention_heads"], config["intermediate_size"])
            for _ in range(config["num_hidden_layers"])])
        self.norm = RMSNorm(config["hidden_size"], config.get("rms_norm_eps", 1e-6))
        self.lm_head = nn.Linear(config["hidden_size"], config["vocab_size"], bias=False)

    def forward(self, input_ids):
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        return self.lm_head(self.norm(x))

    @classmethod
    def from_pretrained(cls, model_dir, device="cuda", dtype=torch.float16):
        with open(os.path.join(model_dir, "config.json")) as f:
            config = json.load(f)
        model = cls(config).to(device=device, dtype=dtype)
        with open(os.path.join(model_dir, "pytorch_model.bin.index.json")) as f:
            weight_map = json.load(f)["weight_map"]
        for shard in sorted(set(weight_map.values())):
            shard_state = torch.load(os.path.join(model_dir, shard), map_location="cpu")
            shard_state = {k.removeprefix("model."): v for k, v in shard_state.items()}
            missing = model.load_state_dict(shard_state, strict=False)
            print(f"loaded {shard}: {len(shard_state)} tensors, {len(missing.unexpected_keys)} unexpected")
        return model.eval()


@torch.inference_mode()
def top_next_tokens(model, tok, prompt, k=5):
    ids = tok(prompt, return_tensors="pt").input_ids.to(model.lm_head.weight.device)
    probs = model(ids)[0, -1].float().softmax(-1)
    top = probs.topk(k)
    return [(tok.decode([i]), round(p, 4)) for p, i in zip(top.values.tolist(), top.indices.tolist())]


if __name__ == "__main__":
    from transformers import AutoTokenizer

    path = os.environ.get("MODEL_DIR", "/checkpoints/llama2-13b-sft/final")
    tok = AutoTokenizer.from_pretrained(path)
    model = LlamaLike.from_pretrained(path)
    for prompt in ["The capital of Australia is", "def fibonacci(n):"]:
        print(prompt, top_next_tokens(model, tok, prompt))
