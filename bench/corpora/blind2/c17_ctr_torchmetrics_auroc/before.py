import argparse
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torchmetrics.classification import BinaryAUROC

NUM_DENSE, NUM_SPARSE = 13, 26


class CriteoDays(Dataset):
    def __init__(self, npz_paths):
        parts = [np.load(p) for p in npz_paths]
        self.dense = np.concatenate([p["X_int"] for p in parts]).astype(np.float32)
        self.sparse = np.concatenate([p["X_cat"] for p in parts]).astype(np.int64)
        self.label = np.concatenate([p["y"] for p in parts]).astype(np.float32)

    def __len__(self):
        return len(self.label)

    def __getitem__(self, i):
        return np.log1p(np.maximum(self.dense[i], 0)), self.sparse[i], self.label[i]


class DeepFM(nn.Module):
    def __init__(self, cardinalities, embed_dim=16, mlp=(400, 400, 400)):
        super().__init__()
        self.embeds = nn.ModuleList([nn.Embedding(c, embed_dim) for c in cardinalities])
        self.linear = nn.ModuleList([nn.Embedding(c, 1) for c in cardinalities])
        self.dense_proj = nn.Linear(NUM_DENSE, embed_dim)
        layers, d = [], (NUM_SPARSE + 1) * embed_dim
        for w in mlp:
            layers += [nn.Linear(d, w), nn.ReLU()]
            d = w
        self.mlp = nn.Sequential(*layers, nn.Linear(d, 1))

    def forward(self, dense, sparse):
        emb = torch.stack([e(sparse[:, i]) for i, e in enumerate(self.embeds)], dim=1)
        emb = torch.cat([emb, self.dense_proj(dense).unsqueeze(1)], dim=1)
        first = sum(l(sparse[:, i]) for i, l in enumerate(self.linear)).squeeze(-1)
        fm = 0.5 * (emb.sum(1).pow(2) - emb.pow(2).sum(1)).sum(-1)
        return first + fm + self.mlp(emb.flatten(1)).squeeze(-1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", nargs="+", default=[f"/data/criteo/day_{d}_reordered.npz" for d in range(7)])
    parser.add_argument("--cardinalities", default="/data/criteo/cardinalities.npy")
    parser.add_argument("--batch_size", type=int, default=8192)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()

    device = torch.device("cuda")
    cards = np.load(args.cardinalities).tolist()
    loader = DataLoader(CriteoDays(args.days), batch_size=args.batch_size, shuffle=True,
                        num_workers=8, pin_memory=True, drop_last=True)
    model = DeepFM(cards).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    train_auroc = BinaryAUROC().to(device)

    for epoch in range(args.epochs):
        model.train()
        t0 = time.time()
        for step, (dense, sparse, label) in enumerate(loader):
            dense, sparse, label = dense.to(device), sparse.to(device), label.to(device)
            logits = model(dense, sparse)
            loss = F.binary_cross_entropy_with_logits(logits, label)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            train_auroc.update(torch.sigmoid(logits.detach()), label.long())
            if step % 2000 == 0:
                print(f"epoch {epoch} step {step}/{len(loader)} loss {loss.item():.5f} "
                      f"{(step + 1) * args.batch_size / (time.time() - t0):.0f} samples/s")
        print(f"epoch {epoch} train AUROC {train_auroc.compute().item():.5f}")
        torch.save(model.state_dict(), f"deepfm_epoch{epoch}.pt")


if __name__ == "__main__":
    main()
