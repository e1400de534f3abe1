import argparse
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model, n_heads, dropout=0.0):
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.proj = nn.Linear(d_model, d_model, bias=False)
        self.dropout = dropout

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.n_heads, -1).transpose(1, 2)
        k = k.view(B, T, self.n_heads, -1).transpose(1, 2)
        v = v.view(B, T, self.n_heads, -1).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, d_model, n_heads):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class CodeLM(nn.Module):
    def __init__(self, vocab=49152, d_model=1536, n_layers=24, n_heads=16, ctx=8192):
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(ctx, d_model)
        self.blocks = nn.ModuleList([Block(d_model, n_heads) for _ in range(n_layers)])
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.head.weight = self.tok.weight

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.size(1), device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data/the_stack_py/train.bin")
    parser.add_argument("--ctx", type=int, default=8192)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--iters", type=int, default=50_000)
    args = parser.parse_args()

    device = torch.device("cuda")
    data = np.memmap(args.data, dtype=np.uint16, mode="r")
    model = CodeLM(ctx=args.ctx).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    warmup = 2000
    for it in range(args.iters):
        lr = 3e-4 * min(1.0, (it + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * it / args.iters))
        for g in opt.param_groups:
            g["lr"] = lr
        ix = np.random.randint(0, len(data) - args.ctx - 1, args.batch_size)
        batch = torch.from_numpy(np.stack([data[i:i + args.ctx + 1] for i in ix]).astype(np.int64)).to(device)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if it % 50 == 0:
            print(f"iter {it} lr {lr:.2e} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
