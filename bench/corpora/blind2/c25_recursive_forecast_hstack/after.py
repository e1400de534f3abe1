import argparse
import logging

import pandas as pd
import torch
import torch.nn as nn

logger = logging.getLogger("forecast")


class TCNBlock(nn.Module):
    def __init__(self, channels, dilation, kernel_size=3, dropout=0.1):
        super().__init__()
        self.pad = (kernel_size - 1) * dilation
        self.conv = nn.Conv1d(channels, channels, kernel_size, dilation=dilation)
        self.norm = nn.BatchNorm1d(channels)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        y = self.conv(nn.functional.pad(x, (self.pad, 0)))
        return x + self.drop(torch.relu(self.norm(y)))


class TCNForecaster(nn.Module):
    def __init__(self, n_covariates, channels=128, levels=8):
        super().__init__()
        self.inp = nn.Conv1d(1 + n_covariates, channels, 1)
        self.blocks = nn.Sequential(*[TCNBlock(channels, 2 ** i) for i in range(levels)])
        self.out = nn.Conv1d(channels, 1, 1)
        self.receptive_field = 1 + 2 * (2 ** levels - 1)

    def forward(self, y, cov):
        return self.out(self.blocks(self.inp(torch.cat([y.unsqueeze(1), cov], dim=1))))[:, 0, -1:]


@torch.no_grad()
def recursive_forecast(model, history, future_cov, horizon):
    """history: (n_series, T); future_cov: (n_series, n_cov, T + horizon)."""
    ctx = model.receptive_field
    window = history[:, -ctx:].clone()
    forecast = []
    T = history.size(1)
    for h in range(horizon):
        cov = future_cov[:, :, T + h - ctx + 1:T + h + 1]
        step_pred = model(window, cov)
        window = window.roll(-1, dims=1)
        window[:, -1:] = step_pred
        forecast.append(step_pred)
    return torch.hstack(forecast)


def main():
    parser = argparse.ArgumentParser(description="Hourly load forecast for every smart meter")
    parser.add_argument("--history", default="/data/meters/load_hourly.parquet")
    parser.add_argument("--covariates", default="/data/meters/calendar_weather.pt")
    parser.add_argument("--weights", default="models/tcn_load.pt")
    parser.add_argument("--horizon", type=int, default=24 * 365)
    parser.add_argument("--out", default="forecasts/load_next_year.parquet")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    device = torch.device("cuda")
    df = pd.read_parquet(args.history)
    history = torch.tensor(df.to_numpy(dtype="float32"), device=device)
    mean, std = history.mean(1, keepdim=True), history.std(1, keepdim=True).clamp(min=1e-3)
    cov = torch.load(args.covariates, map_location="cpu").to(device)
    model = TCNForecaster(cov.size(1))
    model.load_state_dict(torch.load(args.weights, map_location="cpu"))
    model.to(device).eval()

    logger.info("forecasting %d series for %d steps", history.size(0), args.horizon)
    pred = recursive_forecast(model, (history - mean) / std, cov, args.horizon) * std + mean
    out = pd.DataFrame(pred.cpu().numpy(), index=df.index)
    out.to_parquet(args.out)
    logger.info("wrote %s", args.out)


if __name__ == "__main__":
    main()
