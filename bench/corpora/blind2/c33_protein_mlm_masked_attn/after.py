"""Masked-language-model pretraining of a protein sequence encoder on UniRef50."""
import argparse
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from Bio import SeqIO
from torch.utils.data import DataLoader, IterableDataset

AMINO = "ACDEFGHIKLMNPQRSTVWYXBZUO"
PAD, CLS, EOS, MASK = 0, 1, 2, 3
VOCAB = {a: i + 4 for i, a in enumerate(AMINO)}


class UniRefStream(IterableDataset):
    def __init__(self, fasta, max_len=1024):
        self.fasta, self.max_len = fasta, max_len

    def __iter__(self):
        for rec in SeqIO.parse(self.fasta, "fasta"):
            seq = str(rec.seq)
            if len(seq) > self.max_len - 2:
                start = random.randint(0, len(seq) - self.max_len + 2)
                seq = seq[start:start + self.max_len - 2]
            yield torch.tensor([CLS] + [VOCAB.get(a, VOCAB["X"]) for a in seq] + [EOS])


def collate(batch, mask_prob=0.15):
    ids = nn.utils.rnn.pad_sequence(batch, batch_first=True, padding_value=PAD)
    labels = ids.clone()
    maskable = ids > EOS
    chosen = (torch.rand(ids.shape) < mask_prob) & maskable
    labels[~chosen] = -100
    ids = ids.masked_fill(chosen & (torch.rand(ids.shape) < 0.8), MASK)
    return ids, labels


class MultiHeadSelfAttention(nn.Module):
    def __init__(self, dim, n_heads, dropout=0.1):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, dim // n_heads
        self.to_qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, pad_mask):
        B, L, _ = x.shape
        queries, keys, values = (t.view(B, L, self.n_heads, self.head_dim).permute(0, 2, 1, 3)
                                 for t in self.to_qkv(x).chunk(3, dim=-1))
        context = F.scaled_dot_product_attention(queries, keys, values, attn_mask=~pad_mask[:, None, None, :],
                                                 dropout_p=self.dropout.p if self.training else 0.0)
        context = context.permute(0, 2, 1, 3).reshape(B, L, -1)
        return self.out(context)


class EncoderLayer(nn.Module):
    def __init__(self, dim, n_heads, ff_mult=4, dropout=0.1):
        super().__init__()
        self.attn = MultiHeadSelfAttention(dim, n_heads, dropout)
        self.ff = nn.Sequential(nn.Linear(dim, ff_mult * dim), nn.GELU(), nn.Dropout(dropout), nn.Linear(ff_mult * dim, dim))
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)

    def forward(self, x, pad_mask):
        x = x + self.attn(self.ln1(x), pad_mask)
        return x + self.ff(self.ln2(x))


class ProteinEncoder(nn.Module):
    def __init__(self, dim=1280, depth=33, n_heads=20, max_len=1024):
        super().__init__()
        self.embed = nn.Embedding(len(VOCAB) + 4, dim, padding_idx=PAD)
        self.pos = nn.Embedding(max_len, dim)
        self.layers = nn.ModuleList([EncoderLayer(dim, n_heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, len(VOCAB) + 4)

    def forward(self, ids):
        pad_mask = ids == PAD
        x = self.embed(ids) + self.pos(torch.arange(ids.size(1), device=ids.device))
        for layer in self.layers:
            x = layer(x, pad_mask)
        return self.lm_head(self.norm(x))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fasta", default="/data/uniref50/uniref50.fasta")
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--max_steps", type=int, default=500_000)
    args = parser.parse_args()

    device = torch.device("cuda")
    model = ProteinEncoder().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4, betas=(0.9, 0.98), weight_decay=0.01)
    loader = DataLoader(UniRefStream(args.fasta), batch_size=args.batch_size, collate_fn=collate, num_workers=2)
    for step, (ids, labels) in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids.to(device))
            loss = F.cross_entropy(logits.flatten(0, 1), labels.to(device).flatten(), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.4f}")
        if step >= args.max_steps:
            break


if __name__ == "__main__":
    main()
