import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics.classification import BinaryAUROC, BinaryAveragePrecision


class TabularNet(nn.Module):
    def __init__(self, n_num, cat_cards, emb_dim=16, hidden=512):
        super().__init__()
        self.embs = nn.ModuleList([nn.Embedding(c, emb_dim) for c in cat_cards])
        self.net = nn.Sequential(
            nn.Linear(n_num + emb_dim * len(cat_cards), hidden), nn.BatchNorm1d(hidden), nn.ReLU(), nn.Dropout(0.2),
            nn.Linear(hidden, hidden // 2), nn.BatchNorm1d(hidden // 2), nn.ReLU(), nn.Linear(hidden // 2, 1))

    def forward(self, x_num, x_cat):
        emb = [e(x_cat[:, i]) for i, e in enumerate(self.embs)]
        return self.net(torch.cat([x_num] + emb, dim=1)).squeeze(-1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="data/churn_features.pt")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--batch_size", type=int, default=4096)
    args = parser.parse_args()

    device = torch.device("cuda")
    blob = torch.load(args.data, map_location="cpu")
    train_ds = TensorDataset(blob["train_num"], blob["train_cat"], blob["train_y"])
    val_ds = TensorDataset(blob["val_num"], blob["val_cat"], blob["val_y"])
    train_loader = DataLoader(train_ds, batch_size=args.batch_size, shuffle=True, drop_last=True)
    val_loader = DataLoader(val_ds, batch_size=args.batch_size)

    model = TabularNet(blob["train_num"].size(1), blob["cat_cards"]).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    train_auroc = BinaryAUROC().to(device)
    val_auroc, val_ap = BinaryAUROC().to(device), BinaryAveragePrecision().to(device)

    for epoch in range(args.epochs):
        model.train()
        for x_num, x_cat, y in train_loader:
            x_num, x_cat, y = x_num.to(device), x_cat.to(device), y.to(device)
            logits = model(x_num, x_cat)
            loss = F.binary_cross_entropy_with_logits(logits, y.float())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            train_auroc.update(logits.detach().sigmoid(), y.long())
        train_score = train_auroc.compute().item()
        train_auroc.reset()

        model.eval()
        with torch.no_grad():
            for x_num, x_cat, y in val_loader:
                p = model(x_num.to(device), x_cat.to(device)).sigmoid()
                val_auroc.update(p, y.to(device).long())
                val_ap.update(p, y.to(device).long())
        print(f"epoch {epoch}: train AUROC {train_score:.4f} | val AUROC {val_auroc.compute():.4f} "
              f"AP {val_ap.compute():.4f}")
        val_auroc.reset()
        val_ap.reset()


if __name__ == "__main__":
    main()
