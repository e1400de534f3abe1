import numpy as np
import pandas as pd
import timm
import torch
import torch.nn as nn
from sklearn.metrics import roc_auc_score
from torch.utils.data import DataLoader

from dataset import MelanomaDataset, get_transforms

CFG = {"model": "efficientnet_b0", "img_size": 384, "bs": 32, "lr": 1e-4, "epochs": 12, "fold": 0}
device = torch.device("cuda")


def train_epoch(net, loader, optimizer, criterion, scaler):
    net.train()
    train_preds, train_targets, losses = [], [], []
    for images, targets in loader:
        images, targets = images.to(device), targets.float().to(device)
        with torch.cuda.amp.autocast():
            logits = net(images).squeeze(1)
            loss = criterion(logits, targets)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        train_preds.append(torch.sigmoid(logits).detach())
        train_targets.append(targets)
        losses.append(loss.item())
    preds = torch.cat(train_preds).detach().float().cpu().numpy()
    targets = torch.cat(train_targets).cpu().numpy()
    return float(np.mean(losses)), roc_auc_score(targets, preds)


@torch.no_grad()
def valid_epoch(net, loader):
    net.eval()
    preds, targets = [], []
    for images, t in loader:
        preds.append(torch.sigmoid(net(images.to(device)).squeeze(1)).float().cpu())
        targets.append(t)
    return roc_auc_score(torch.cat(targets).numpy(), torch.cat(preds).numpy())


def run_fold(df, fold):
    trn, val = df[df.fold != fold], df[df.fold == fold]
    train_loader = DataLoader(MelanomaDataset(trn, get_transforms("train", CFG["img_size"])),
                              batch_size=CFG["bs"], shuffle=True, num_workers=8, drop_last=True)
    valid_loader = DataLoader(MelanomaDataset(val, get_transforms("valid", CFG["img_size"])),
                              batch_size=CFG["bs"] * 2, shuffle=False, num_workers=8)
    net = timm.create_model(CFG["model"], pretrained=True, num_classes=1).to(device)
    optimizer = torch.optim.AdamW(net.parameters(), lr=CFG["lr"])
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=CFG["epochs"])
    criterion = nn.BCEWithLogitsLoss()
    scaler = torch.cuda.amp.GradScaler()
    best_auc = 0.0
    for epoch in range(CFG["epochs"]):
        tr_loss, tr_auc = train_epoch(net, train_loader, optimizer, criterion, scaler)
        val_auc = valid_epoch(net, valid_loader)
        scheduler.step()
        print(f"fold {fold} epoch {epoch}: loss {tr_loss:.4f} train auc {tr_auc:.4f} val auc {val_auc:.4f}")
        if val_auc > best_auc:
            best_auc = val_auc
            torch.save(net.state_dict(), f"{CFG['model']}_fold{fold}.pth")
    return best_auc


if __name__ == "__main__":
    folds = pd.read_csv("train_folds.csv")
    print("best auc", run_fold(folds, CFG["fold"]))
