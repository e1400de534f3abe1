import numpy as np
import pandas as pd
import torch
import torch.nn as nn
from sklearn.preprocessing import MinMaxScaler
from torch.utils.data import DataLoader, Dataset

WINDOW = 48
HORIZON = 1


class WindowDataset(Dataset):
    def __init__(self, series, window=WINDOW, horizon=HORIZON):
        self.series = torch.tensor(series, dtype=torch.float32)
        self.window = window
        self.horizon = horizon

    def __len__(self):
        return len(self.series) - self.window - self.horizon + 1

    def __getitem__(self, i):
        x = self.series[i:i + self.window]
        y = self.series[i + self.window:i + self.window + self.horizon, 0]
        return x, y


class LSTMForecaster(nn.Module):
    def __init__(self, n_features, hidden=128, layers=2):
        super().__init__()
        self.lstm = nn.LSTM(n_features, hidden, num_layers=layers, batch_first=True, dropout=0.1)
        self.head = nn.Linear(hidden, HORIZON)

    def forward(self, x):
        out, _ = self.lstm(x)
        return self.head(out[:, -1])


df = pd.read_csv("energy.csv", parse_dates=["timestamp"]).set_index("timestamp")
scaler = MinMaxScaler()
values = scaler.fit_transform(df[["load", "temperature", "humidity"]].values)
split = int(len(values) * 0.8)
train_loader = DataLoader(WindowDataset(values[:split]), batch_size=256, shuffle=True)
val_loader = DataLoader(WindowDataset(values[split:]), batch_size=512)

device = "cuda" if torch.cuda.is_available() else "cpu"
forecaster = LSTMForecaster(n_features=values.shape[1]).to(device)
optimizer = torch.optim.Adam(forecaster.parameters(), lr=1e-3)
mse = nn.MSELoss()

for epoch in range(100):
    forecaster.train()
    total_loss = 0
    for xb, yb in train_loader:
        xb, yb = xb.to(device), yb.to(device)
        pred = forecaster(xb)
        loss = mse(pred, yb)
        total_loss += loss.item()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    forecaster.eval()
    val_err = []
    with torch.no_grad():
        for xb, yb in val_loader:
            val_err.append(((forecaster(xb.to(device)) - yb.to(device)) ** 2).mean().item())
    if epoch % 5 == 0:
        print(f"epoch {epoch}: train mse {total_loss / len(train_loader):.5f} "
              f"val mse {np.mean(val_err):.5f}")

torch.save(forecaster.state_dict(), "lstm_forecaster.pt")
