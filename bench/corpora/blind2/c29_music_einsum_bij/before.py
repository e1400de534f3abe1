"""Decoder-only transformer over MIDI event tokens (MAESTRO), 2048-event context."""
import argparse
import glob
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class MidiEventDataset(Dataset):
    def __init__(self, pattern, seq_len):
        self.seqs = [np.load(p) for p in sorted(glob.glob(pattern))]
        self.seqs = [s for s in self.seqs if len(s) > seq_len + 1]
        self.seq_len = seq_len

    def __len__(self):
        return sum(len(s) // self.seq_len for s in self.seqs)

    def __getitem__(self, _):
        s = random.choice(self.seqs)
        i = random.randint(0, len(s) - self.seq_len - 1)
        chunk = torch.from_numpy(s[i:i + self.seq_len + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


class CausalAttention(nn.Module):
    def __init__(self, d_model, n_heads, max_len, dropout=0.1):
        super().__init__()
        self.h, self.d = n_heads, d_model // n_heads
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)
        self.attn_drop = nn.Dropout(dropout)
        self.scale = self.d ** -0.5
        self.register_buffer("causal", torch.triu(torch.ones(max_len, max_len, dtype=torch.bool), 1), persistent=False)

    def _split(self, t, B, T):
        return t.view(B, T, self.h, self.d).transpose(1, 2).reshape(B * self.h, T, self.d)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self._split(self.q(x), B, T), self._split(self.k(x), B, T), self._split(self.v(x), B, T)
        k_t = k.transpose(1, 2)
        logits = torch.einsum("bij,bjk->bik", q, k_t) * self.scale
        logits = logits.masked_fill(self.causal[:T, :T], float("-inf"))
        weights = self.attn_drop(logits.softmax(dim=-1))
        y = torch.einsum("bij,bjk->bik", weights, v)
        return self.o(y.view(B, self.h, T, self.d).transpose(1, 2).reshape(B, T, C))


class MusicTransformer(nn.Module):
    def __init__(self, vocab=388, d_model=512, n_layers=8, n_heads=8, max_len=2048):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        self.attn = nn.ModuleList([CausalAttention(d_model, n_heads, max_len) for _ in range(n_layers)])
        self.ff = nn.ModuleList([nn.Sequential(nn.LayerNorm(d_model), nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                               nn.Linear(4 * d_model, d_model)) for _ in range(n_layers)])
        self.ln = nn.ModuleList([nn.LayerNorm(d_model) for _ in range(n_layers)])
        self.out = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        x = self.emb(tokens) + self.pos(torch.arange(tokens.size(1), device=tokens.device))
        for attn, ff, ln in zip(self.attn, self.ff, self.ln):
            x = x + attn(ln(x))
            x = x + ff(x)
        return self.out(x)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data/maestro_v3_events/train/*.npy")
    parser.add_argument("--seq_len", type=int, default=2048)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=200_000)
    args = parser.parse_args()

    device = torch.device("cuda")
    loader = DataLoader(MidiEventDataset(args.data, args.seq_len), batch_size=args.batch_size, num_workers=4)
    model = MusicTransformer(max_len=args.seq_len).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))
    step = 0
    while step < args.steps:
        for x, y in loader:
            logits = model(x.to(device))
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.to(device).reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % 100 == 0:
                print(f"step {step} loss {loss.item():.4f}")
            if step >= args.steps:
                break


if __name__ == "__main__":
    main()
