import numpy as np
import torch
import torch.nn as nn
from sklearn.metrics import average_precision_score, roc_auc_score
from torch.utils.data import DataLoader


class ChestXrayNet(nn.Module):
    def __init__(self, backbone, feat_dim=1024, n_labels=14):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(feat_dim, n_labels)

    def forward(self, x):
        return self.head(self.backbone(x))


def macro_auc(targets, scores):
    aucs = [roc_auc_score(targets[:, j], scores[:, j]) for j in range(targets.shape[1])
            if 0 < targets[:, j].sum() < len(targets)]
    return float(np.mean(aucs))


def run_epoch(net, loader, criterion, device, optimizer=None):
    training = optimizer is not None
    net.train(training)
    epoch_scores, epoch_targets, loss_sum = [], [], 0.0
    for images, targets in loader:
        images, targets = images.to(device), targets.to(device).float()
        with torch.set_grad_enabled(training):
            logits = net(images)
            loss = criterion(logits, targets)
        if training:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        epoch_scores.append(torch.sigmoid(logits).detach().cpu())
        epoch_targets.append(targets.cpu())
        loss_sum += loss.item() * images.size(0)
    scores = torch.cat(epoch_scores).numpy()
    targets = torch.cat(epoch_targets).numpy()
    return {"loss": loss_sum / len(loader.dataset), "auc": macro_auc(targets, scores),
            "map": average_precision_score(targets, scores, average="macro")}


def main(backbone, train_set, val_set, epochs=20, device="cuda"):
    net = ChestXrayNet(backbone).to(device)
    pos = torch.stack([t for _, t in train_set]).float().mean(0)
    criterion = nn.BCEWithLogitsLoss(pos_weight=((1 - pos) / pos.clamp(min=1e-3)).to(device))
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-4, betas=(0.9, 0.999))
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="max", factor=0.1, patience=1)
    train_loader = DataLoader(train_set, batch_size=32, shuffle=True, num_workers=8, pin_memory=True)
    val_loader = DataLoader(val_set, batch_size=64, shuffle=False, num_workers=8, pin_memory=True)
    best = 0.0
    for epoch in range(epochs):
        tr = run_epoch(net, train_loader, criterion, device, optimizer)
        va = run_epoch(net, val_loader, criterion, device)
        scheduler.step(va["auc"])
        print(f"epoch {epoch}: train loss {tr['loss']:.4f} auc {tr['auc']:.4f} | "
              f"val loss {va['loss']:.4f} auc {va['auc']:.4f} mAP {va['map']:.4f}")
        if va["auc"] > best:
            best = va["auc"]
            torch.save(net.state_dict(), "chexnet_best.pth")
    return best
