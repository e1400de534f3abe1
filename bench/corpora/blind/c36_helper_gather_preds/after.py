import numpy as np
import torch
import torch.nn as nn
from scipy.stats import pearsonr
from torch.utils.data import DataLoader


def to_host(t):
    """Cast to fp32 and move to CPU so metrics do not sit on the GPU."""
    return t.float().cpu()


def pearson(preds, targets):
    return pearsonr(preds.ravel(), targets.ravel())[0]


class RegressionHead(nn.Module):
    def __init__(self, backbone, hidden, n_targets):
        super().__init__()
        self.backbone = backbone
        self.dropout = nn.Dropout(0.1)
        self.fc = nn.Linear(hidden, n_targets)

    def forward(self, input_ids, attention_mask):
        h = self.backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        mask = attention_mask.unsqueeze(-1).float()
        pooled = (h * mask).sum(1) / mask.sum(1).clamp(min=1e-6)
        return self.fc(self.dropout(pooled))


def train_loop(regressor, train_ds, valid_ds, epochs=4, lr=2e-5, bs=16, device="cuda"):
    train_dl = DataLoader(train_ds, batch_size=bs, shuffle=True, num_workers=2)
    valid_dl = DataLoader(valid_ds, batch_size=bs * 4, shuffle=False, num_workers=2)
    regressor.to(device)
    optimizer = torch.optim.AdamW(regressor.parameters(), lr=lr, weight_decay=0.01)
    loss_fn = nn.SmoothL1Loss(beta=0.5)
    scaler = torch.cuda.amp.GradScaler()

    for epoch in range(epochs):
        regressor.train()
        epoch_preds, epoch_targets = [], []
        for batch in train_dl:
            ids, mask, y = (batch[k].to(device) for k in ("input_ids", "attention_mask", "targets"))
            with torch.autocast("cuda", dtype=torch.float16):
                preds = regressor(ids, mask)
                loss = loss_fn(preds.float(), y)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            epoch_preds.append(to_host(preds.detach()))
            epoch_targets.append(to_host(y))
        train_r = pearson(torch.cat(epoch_preds).detach().numpy(), torch.cat(epoch_targets).numpy())

        regressor.eval()
        v_preds, v_targets = [], []
        with torch.inference_mode():
            for batch in valid_dl:
                ids, mask, y = (batch[k].to(device) for k in ("input_ids", "attention_mask", "targets"))
                v_preds.append(to_host(regressor(ids, mask)))
                v_targets.append(to_host(y))
        valid_r = pearson(torch.cat(v_preds).numpy(), torch.cat(v_targets).numpy())
        print(f"epoch {epoch}: train pearson {train_r:.4f} valid pearson {valid_r:.4f}")
        np.save(f"valid_preds_epoch{epoch}.npy", torch.cat(v_preds).numpy())
    return regressor
