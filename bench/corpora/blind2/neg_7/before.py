"""Toy task: learn to sort 8 numbers with a tiny attention model (pointer-style decoding)."""
import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F

SEQ_LEN = 8


class TinyAttention(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.q = nn.Linear(dim, dim)
        self.k = nn.Linear(dim, dim)
        self.v = nn.Linear(dim, dim)
        self.scale = dim ** -0.5

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = torch.bmm(q, k.transpose(1, 2)) * self.scale
        weights = scores.softmax(dim=-1)
        return torch.bmm(weights, v), weights


class Sorter(nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.embed = nn.Linear(1, dim)
        self.pos = nn.Parameter(torch.randn(SEQ_LEN, dim) * 0.02)
        self.attn1 = TinyAttention(dim)
        self.attn2 = TinyAttention(dim)
        self.ff = nn.Sequential(nn.Linear(dim, 4 * dim), nn.ReLU(), nn.Linear(4 * dim, dim))
        self.out = nn.Linear(dim, SEQ_LEN)

    def forward(self, values):
        h = self.embed(values.unsqueeze(-1))
        h = h + self.attn1(h)[0]
        h = h + self.ff(h)
        h = h + self.pos
        h = h + self.attn2(h)[0]
        return self.out(h)


def make_batch(batch_size, device):
    values = torch.rand(batch_size, SEQ_LEN, device=device)
    target = values.argsort(dim=1)
    return values, target


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5000)
    parser.add_argument("--batch_size", type=int, default=256)
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"

    model = Sorter().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        values, target = make_batch(args.batch_size, device)
        logits = model(values)
        loss = F.cross_entropy(logits.reshape(-1, SEQ_LEN), target.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 500 == 0:
            acc = (logits.argmax(-1) == target).all(dim=1).float().mean().item()
            print(f"step {step} loss {loss.item():.4f} exact-sort acc {acc:.3f}")


if __name__ == "__main__":
    main()
