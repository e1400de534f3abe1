"""Online anomaly scoring for a fleet of machines with a recurrent next-step forecaster."""
import argparse
import json
import logging

import pandas as pd
import torch
import torch.nn as nn

log = logging.getLogger(__name__)


class GRUCellScratch(nn.Module):
    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.x2h = nn.Linear(input_size, 3 * hidden_size)
        self.h2h = nn.Linear(hidden_size, 3 * hidden_size)

    def forward(self, x, h):
        xr, xz, xn = self.x2h(x).chunk(3, dim=-1)
        hr, hz, hn = self.h2h(h).chunk(3, dim=-1)
        r = torch.sigmoid(xr + hr)
        z = torch.sigmoid(xz + hz)
        n = torch.tanh(xn + r * hn)
        return (1.0 - z) * n + z * h


class Forecaster(nn.Module):
    def __init__(self, n_sensors, hidden_size=256):
        super().__init__()
        self.proj = nn.Sequential(nn.Linear(n_sensors, hidden_size), nn.SiLU())
        self.cell = GRUCellScratch(hidden_size, hidden_size)
        self.head = nn.Linear(hidden_size, n_sensors)
        self.hidden_size = hidden_size


class OnlineDetector:
    def __init__(self, model, n_machines, threshold, device):
        self.model = model.eval()
        self.device = device
        self.threshold = threshold
        self.h = torch.zeros(n_machines, model.hidden_size, device=device)
        self.prev_pred = None

    def step(self, readings):
        x = torch.as_tensor(readings, dtype=torch.float32, device=self.device)
        if self.prev_pred is None:
            scores = torch.zeros(x.size(0), device=self.device)
        else:
            scores = (x - self.prev_pred).pow(2).mean(dim=-1)
        self.h = self.model.cell(self.model.proj(x), self.h)
        self.prev_pred = self.model.head(self.h)
        flagged = (scores > self.threshold).nonzero().flatten().tolist()
        return flagged, scores.max().item()


def read_stream(path, chunksize):
    for frame in pd.read_csv(path, chunksize=chunksize, parse_dates=["timestamp"]):
        for ts, group in frame.groupby("timestamp", sort=True):
            yield ts, group.sort_values("machine_id").drop(columns=["timestamp", "machine_id"]).to_numpy()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--stream", default="/data/telemetry/2023_full.csv")
    parser.add_argument("--weights", default="models/forecaster.pt")
    parser.add_argument("--n_sensors", type=int, default=96)
    parser.add_argument("--n_machines", type=int, default=2048)
    parser.add_argument("--threshold", type=float, default=4.0)
    parser.add_argument("--alerts", default="alerts.jsonl")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Forecaster(args.n_sensors)
    model.load_state_dict(torch.load(args.weights, map_location="cpu"))
    detector = OnlineDetector(model.to(device), args.n_machines, args.threshold, device)

    with open(args.alerts, "w") as out:
        for i, (ts, readings) in enumerate(read_stream(args.stream, chunksize=500_000)):
            flagged, worst = detector.step(readings)
            for m in flagged:
                out.write(json.dumps({"timestamp": str(ts), "machine": m}) + "\n")
            if i % 10_000 == 0:
                log.info("%s processed, worst score %.3f, %d alerts", ts, worst, len(flagged))


if __name__ == "__main__":
    main()
