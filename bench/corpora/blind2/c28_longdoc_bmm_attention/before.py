import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from datasets import load_dataset
from torch.utils.data import DataLoader
from transformers import AutoTokenizer


class SelfAttention(nn.Module):
    def __init__(self, dim, heads, dropout=0.1):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.dropout = dropout

    def forward(self, x, pad_mask):
        B, L, D = x.shape
        hd = D // self.heads
        q, k, v = self.qkv(x).view(B, L, 3, self.heads, hd).permute(2, 0, 3, 1, 4).reshape(3, B * self.heads, L, hd)
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(hd)
        scores = scores.masked_fill(pad_mask.repeat_interleave(self.heads, 0)[:, None, :], float("-inf"))
        attn = F.dropout(torch.softmax(scores, dim=-1), p=self.dropout, training=self.training)
        out = torch.bmm(attn, v)
        out = out.view(B, self.heads, L, hd).transpose(1, 2).reshape(B, L, D)
        return self.proj(out)


class Block(nn.Module):
    def __init__(self, dim, heads, mlp_ratio=4):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = SelfAttention(dim, heads)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim))

    def forward(self, x, pad_mask):
        x = x + self.attn(self.ln1(x), pad_mask)
        return x + self.mlp(self.ln2(x))


class LongDocClassifier(nn.Module):
    def __init__(self, vocab, n_classes, dim=768, depth=12, heads=12, max_len=4096):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(1, max_len, dim))
        self.blocks = nn.ModuleList([Block(dim, heads) for _ in range(depth)])
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, n_classes)

    def forward(self, ids, attention_mask):
        pad_mask = attention_mask == 0
        x = self.tok(ids) + self.pos[:, : ids.size(1)]
        for blk in self.blocks:
            x = blk(x, pad_mask)
        x = self.norm(x)
        keep = attention_mask.unsqueeze(-1).float()
        return self.head((x * keep).sum(1) / keep.sum(1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dataset", default="ccdv/arxiv-classification")
    parser.add_argument("--max_len", type=int, default=4096)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=10)
    args = parser.parse_args()

    tokenizer = AutoTokenizer.from_pretrained("roberta-base")
    ds = load_dataset(args.dataset, split="train")
    ds = ds.map(lambda b: tokenizer(b["text"], truncation=True, max_length=args.max_len, padding="max_length"),
                batched=True, remove_columns=["text"])
    ds.set_format("torch", columns=["input_ids", "attention_mask", "label"])
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=4)

    device = torch.device("cuda")
    model = LongDocClassifier(tokenizer.vocab_size, 11, max_len=args.max_len).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, weight_decay=0.01)
    scaler = torch.cuda.amp.GradScaler()
    for epoch in range(args.epochs):
        model.train()
        for step, batch in enumerate(loader):
            with torch.autocast("cuda", dtype=torch.float16):
                logits = model(batch["input_ids"].to(device), batch["attention_mask"].to(device))
                loss = F.cross_entropy(logits, batch["label"].to(device))
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            if step % 50 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
