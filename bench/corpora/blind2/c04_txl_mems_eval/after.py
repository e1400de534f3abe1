import argparse
import math
import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class XLLayer(nn.Module):
    def __init__(self, d_model, n_head, d_inner, dropout):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, n_head, dropout=dropout, batch_first=True)
        self.ff = nn.Sequential(nn.Linear(d_model, d_inner), nn.GELU(), nn.Dropout(dropout),
                                nn.Linear(d_inner, d_model))
        self.ln1 = nn.LayerNorm(d_model)
        self.ln2 = nn.LayerNorm(d_model)

    def forward(self, h, mem, attn_mask):
        ctx = h if mem is None else torch.cat([mem, h], dim=1)
        a, _ = self.attn(h, ctx, ctx, attn_mask=attn_mask, need_weights=False)
        h = self.ln1(h + a)
        return self.ln2(h + self.ff(h))


class MemTransformerLM(nn.Module):
    def __init__(self, n_token, n_layer, d_model, n_head, d_inner, mem_len, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(n_token, d_model)
        self.layers = nn.ModuleList([XLLayer(d_model, n_head, d_inner, dropout) for _ in range(n_layer)])
        self.out = nn.Linear(d_model, n_token)
        self.mem_len = mem_len
        self.scale = math.sqrt(d_model)

    def forward(self, x, mems=None):
        h = self.embed(x) * self.scale
        qlen = x.size(1)
        mlen = 0 if mems is None else mems[0].size(1)
        mask = torch.triu(torch.ones(qlen, qlen + mlen, dtype=torch.bool, device=x.device),
                          diagonal=1 + mlen)
        new_mems = []
        for i, layer in enumerate(self.layers):
            prev = None if mems is None else mems[i]
            cat = h if prev is None else torch.cat([prev, h], dim=1)
            new_mems.append(cat[:, -self.mem_len:])
            h = layer(h, prev, mask)
        return self.out(h), new_mems


def load_split(data_dir, split, bsz, device):
    raw = np.fromfile(os.path.join(data_dir, f"{split}.bin"), dtype=np.uint8)
    n = len(raw) // bsz
    return torch.from_numpy(raw[:n * bsz].astype(np.int64)).view(bsz, n).to(device)


def evaluate_bpc(model, data, tgt_len):
    model.eval()
    mems = None
    total_nll, total_chars = 0.0, 0
    for i in range(0, data.size(1) - 1, tgt_len):
        mems = None if mems is None else [m.detach() for m in mems]
        seq_len = min(tgt_len, data.size(1) - 1 - i)
        x = data[:, i:i + seq_len]
        y = data[:, i + 1:i + 1 + seq_len]
        logits, mems = model(x, mems)
        nll = F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum")
        total_nll += nll.item()
        total_chars += y.numel()
    return total_nll / total_chars / math.log(2)


def main():
    parser = argparse.ArgumentParser(description="Evaluate a Transformer-XL style model on enwik8")
    parser.add_argument("--data", default="data/enwik8")
    parser.add_argument("--checkpoint", default="work/enwik8_base/model.pt")
    parser.add_argument("--n_layer", type=int, default=12)
    parser.add_argument("--d_model", type=int, default=512)
    parser.add_argument("--n_head", type=int, default=8)
    parser.add_argument("--d_inner", type=int, default=2048)
    parser.add_argument("--tgt_len", type=int, default=512)
    parser.add_argument("--mem_len", type=int, default=512)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--split", default="test", choices=["valid", "test"])
    args = parser.parse_args()

    device = torch.device("cuda")
    model = MemTransformerLM(256, args.n_layer, args.d_model, args.n_head, args.d_inner, args.mem_len)
    model.load_state_dict(torch.load(args.checkpoint, map_location="cpu"))
    model.to(device)
    data = load_split(args.data, args.split, args.batch_size, device)
    bpc = evaluate_bpc(model, data, args.tgt_len)
    print(f"{args.split} bpc: {bpc:.4f}")


if __name__ == "__main__":
    main()
