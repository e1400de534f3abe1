import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader


def validate(net, loader, device, num_classes):
    net.eval()
    confusion = torch.zeros(num_classes, num_classes, dtype=torch.long)
    total_loss, n = 0.0, 0
    for images, masks in loader:
        images, masks = images.to(device), masks.to(device)
        logits = net(images)
        total_loss += F.cross_entropy(logits, masks, ignore_index=255, reduction="sum").item()
        n += (masks != 255).sum().item()
        pred = logits.argmax(1)
        valid = masks != 255
        idx = masks[valid] * num_classes + pred[valid]
        confusion += torch.bincount(idx, minlength=num_classes ** 2).reshape(num_classes, num_classes).cpu()
    iou = confusion.diag() / (confusion.sum(0) + confusion.sum(1) - confusion.diag()).clamp(min=1)
    return {"loss": total_loss / max(n, 1), "miou": iou.float().mean().item()}


def poly_lr(optimizer, base_lr, it, max_it, power=0.9):
    lr = base_lr * (1 - it / max_it) ** power
    for g in optimizer.param_groups:
        g["lr"] = lr
    return lr


def train(net, train_set, val_set, num_classes, epochs=80, base_lr=0.01, device="cuda"):
    train_loader = DataLoader(train_set, batch_size=16, shuffle=True, num_workers=8, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=8, shuffle=False, num_workers=4)
    net.to(device)
    optimizer = torch.optim.SGD(net.parameters(), lr=base_lr, momentum=0.9, weight_decay=1e-4)
    max_it, it, best = epochs * len(train_loader), 0, 0.0
    for epoch in range(epochs):
        net.train()
        for images, masks in train_loader:
            images, masks = images.to(device), masks.to(device)
            out = net(images)
            loss = F.cross_entropy(out, masks, ignore_index=255)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            poly_lr(optimizer, base_lr, it, max_it)
            it += 1

        with torch.no_grad():
            val_metrics = validate(net, val_loader, device, num_classes)
        print(f"epoch {epoch}: val loss {val_metrics['loss']:.4f} mIoU {val_metrics['miou']:.4f}")
        if val_metrics["miou"] > best:
            best = val_metrics["miou"]
            os.makedirs("checkpoints", exist_ok=True)
            torch.save(net.state_dict(), "checkpoints/best.pth")
    return best


class TinySegNet(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, stride=2, padding=1),
                                 nn.ReLU())
        self.dec = nn.Sequential(nn.ConvTranspose2d(64, 32, 2, stride=2), nn.ReLU(), nn.Conv2d(32, num_classes, 1))

    def forward(self, x):
        return self.dec(self.enc(x))
