"""Truncated-BPTT training of a GRU load forecaster on long contiguous meter series."""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class GRUForecaster(nn.Module):
    def __init__(self, n_features, hidden=512, layers=3, horizon=24):
        super().__init__()
        self.gru = nn.GRU(n_features, hidden, layers, batch_first=True, dropout=0.1)
        self.head = nn.Linear(hidden, horizon)

    def forward(self, x, h):
        out, h = self.gru(x, h)
        return self.head(out), h


def contiguous_windows(series, batch_size, window):
    """Split series into batch_size parallel streams and walk them window by window."""
    n = series.shape[0] // batch_size
    streams = series[: n * batch_size].reshape(batch_size, n, -1)
    for start in range(0, n - window - 24, window):
        x = streams[:, start:start + window]
        y = np.stack([streams[:, start + 1 + k:start + 1 + k + window, 0] for k in range(24)], axis=-1)
        yield torch.from_numpy(x).float(), torch.from_numpy(y).float()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/data/grid/load_features_15min.npy")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--window", type=int, default=192)
    parser.add_argument("--epochs", type=int, default=50)
    args = parser.parse_args()

    device = torch.device("cuda")
    series = np.load(args.data, mmap_mode="r")
    model = GRUForecaster(series.shape[1]).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        model.train()
        h = torch.zeros(model.gru.num_layers, args.batch_size, model.gru.hidden_size, device=device)
        total, n = 0.0, 0
        for x, y in contiguous_windows(series, args.batch_size, args.window):
            x, y = x.to(device), y.to(device)
            h = h.detach()
            pred, h = model(x, h)
            loss = F.l1_loss(pred, y)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            total += loss.item()
            n += 1
        print(f"epoch {epoch}: train MAE {total / max(n, 1):.4f}")
        torch.save(model.state_dict(), f"checkpoints/gru_load_{epoch}.pt")


if __name__ == "__main__":
    main()
