import numpy as np
import pandas as pd
import torch
import torch.nn as nn
from sklearn.metrics import mean_squared_error
from sklearn.model_selection import KFold
from torch.utils.data import DataLoader, TensorDataset

SEED = 42
N_FOLDS = 5
EPOCHS = 40
BATCH = 512
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class MLP(nn.Module):
    def __init__(self, n_in, hidden=512, p=0.2):
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(n_in, hidden), nn.BatchNorm1d(hidden), nn.SiLU(), nn.Dropout(p),
            nn.Linear(hidden, hidden // 2), nn.BatchNorm1d(hidden // 2), nn.SiLU(), nn.Dropout(p),
            nn.Linear(hidden // 2, 1),
        )

    def forward(self, x):
        return self.body(x).squeeze(-1)


train = pd.read_csv("train.csv")
features = [c for c in train.columns if c.startswith("f_")]
X = train[features].values.astype(np.float32)
y = train["target"].values.astype(np.float32)
oof = np.zeros(len(train), dtype=np.float32)

kf = KFold(n_splits=N_FOLDS, shuffle=True, random_state=SEED)
for fold, (tr_idx, va_idx) in enumerate(kf.split(X)):
    torch.manual_seed(SEED + fold)
    tr_dl = DataLoader(TensorDataset(torch.from_numpy(X[tr_idx]), torch.from_numpy(y[tr_idx])),
                       batch_size=BATCH, shuffle=True, drop_last=True)
    va_dl = DataLoader(TensorDataset(torch.from_numpy(X[va_idx]), torch.from_numpy(y[va_idx])),
                       batch_size=BATCH * 2, shuffle=False)
    fold_model = MLP(len(features)).to(device)
    opt = torch.optim.AdamW(fold_model.parameters(), lr=1e-3, weight_decay=1e-5)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, epochs=EPOCHS,
                                                steps_per_epoch=len(tr_dl))
    loss_fn = nn.MSELoss()

    for epoch in range(EPOCHS):
        fold_model.train()
        for xb, yb in tr_dl:
            xb, yb = xb.to(device), yb.to(device)
            loss = loss_fn(fold_model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()

    fold_model.eval()
    fold_preds = []
    with torch.no_grad():
        for xb, _ in va_dl:
            preds = fold_model(xb.to(device))
            fold_preds.append(preds.detach().cpu().numpy())
    oof[va_idx] = np.concatenate(fold_preds)
    rmse = mean_squared_error(y[va_idx], oof[va_idx]) ** 0.5
    print(f"fold {fold}: rmse {rmse:.5f}")
    torch.save(fold_model.state_dict(), f"mlp_fold{fold}.pt")

print(f"CV rmse: {mean_squared_error(y, oof) ** 0.5:.5f}")
np.save("oof_mlp.npy", oof)
