import argparse
import logging

import pyarrow.dataset as pads
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, IterableDataset

logger = logging.getLogger("fraud")


class RankMetric:
    """Area under the ROC curve over everything seen since the last reset."""

    def __init__(self):
        self.scores, self.labels = [], []

    def update(self, scores, labels):
        self.scores.append(scores.detach().float().cpu())
        self.labels.append(labels.detach().cpu())

    def compute(self):
        s, y = torch.cat(self.scores), torch.cat(self.labels).float()
        ranks = torch.empty_like(s)
        ranks[s.argsort()] = torch.arange(1, s.numel() + 1, dtype=s.dtype)
        n_pos = y.sum()
        n_neg = y.numel() - n_pos
        return ((ranks * y).sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg).clamp(min=1)

    def reset(self):
        self.scores.clear()
        self.labels.clear()


class Transactions(IterableDataset):
    def __init__(self, path, feature_cols, batch_rows=8192):
        self.path, self.cols, self.batch_rows = path, feature_cols, batch_rows

    def __iter__(self):
        ds = pads.dataset(self.path, format="parquet")
        for rb in ds.to_batches(columns=self.cols + ["is_fraud"], batch_size=self.batch_rows):
            x = torch.tensor(rb.select(self.cols).to_pandas().to_numpy(), dtype=torch.float32)
            y = torch.tensor(rb.column("is_fraud").to_numpy(), dtype=torch.float32)
            yield x, y


class MLP(nn.Module):
    def __init__(self, n_in, widths=(512, 256, 128)):
        super().__init__()
        layers, d = [], n_in
        for w in widths:
            layers += [nn.Linear(d, w), nn.BatchNorm1d(w), nn.ReLU(), nn.Dropout(0.1)]
            d = w
        self.body = nn.Sequential(*layers, nn.Linear(d, 1))

    def forward(self, x):
        return self.body(x).squeeze(-1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train", default="s3-mirror/transactions/train/")
    parser.add_argument("--valid", default="s3-mirror/transactions/valid/")
    parser.add_argument("--n_features", type=int, default=214)
    parser.add_argument("--epochs", type=int, default=20)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    cols = [f"f{i}" for i in range(args.n_features)]
    device = torch.device("cuda")
    model = MLP(args.n_features).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    pos_weight = torch.tensor(30.0, device=device)
    train_auc, val_auc = RankMetric(), RankMetric()

    for epoch in range(args.epochs):
        model.train()
        for step, (x, y) in enumerate(DataLoader(Transactions(args.train, cols), batch_size=None, num_workers=4)):
            x, y = x.to(device), y.to(device)
            logits = model(x)
            loss = F.binary_cross_entropy_with_logits(logits, y, pos_weight=pos_weight)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            train_auc.update(torch.sigmoid(logits), y)
            if step % 1000 == 0:
                logger.info("epoch %d step %d loss %.4f", epoch, step, loss.item())
        logger.info("epoch %d train AUC %.4f", epoch, train_auc.compute())
        train_auc.reset()

        model.eval()
        with torch.no_grad():
            for x, y in DataLoader(Transactions(args.valid, cols), batch_size=None, num_workers=4):
                val_auc.update(torch.sigmoid(model(x.to(device))), y)
        logger.info("epoch %d valid AUC %.4f", epoch, val_auc.compute())
        val_auc.reset()
        torch.save(model.state_dict(), f"checkpoints/fraud_mlp_{epoch}.pt")


if __name__ == "__main__":
    main()
