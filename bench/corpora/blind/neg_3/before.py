from collections import defaultdict

import torch
import torch.nn as nn
import torch.nn.functional as F


def compute_losses(outputs, batch, weights):
    """Returns the total loss (for backward) and a dict of python floats for logging."""
    cls_loss = F.cross_entropy(outputs["cls"], batch["label"])
    box_loss = F.smooth_l1_loss(outputs["box"], batch["box"], beta=1.0 / 9)
    obj_loss = F.binary_cross_entropy_with_logits(outputs["obj"], batch["obj"])
    total = weights["cls"] * cls_loss + weights["box"] * box_loss + weights["obj"] * obj_loss
    logs = {"cls": cls_loss.item(), "box": box_loss.item(), "obj": obj_loss.item(), "total": total.item()}
    return total, logs


class Detector(nn.Module):
    def __init__(self, num_classes, feat=256):
        super().__init__()
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 64, 7, stride=2, padding=3), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
            nn.Conv2d(128, feat, 3, stride=2, padding=1), nn.BatchNorm2d(feat), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.cls = nn.Linear(feat, num_classes)
        self.box = nn.Linear(feat, 4)
        self.obj = nn.Linear(feat, 1)

    def forward(self, x):
        h = self.backbone(x)
        return {"cls": self.cls(h), "box": self.box(h), "obj": self.obj(h).squeeze(1)}


def train_epoch(det, loader, optimizer, device, weights, epoch, log_every=50):
    det.train()
    meters = defaultdict(float)
    for step, batch in enumerate(loader, start=1):
        batch = {k: v.to(device) for k, v in batch.items()}
        outputs = det(batch["image"])
        total, logs = compute_losses(outputs, batch, weights)
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        for k, v in logs.items():
            meters[k] += v
        if step % log_every == 0:
            print(f"epoch {epoch} step {step}: " + " ".join(f"{k}={v / step:.4f}" for k, v in meters.items()))
    return {k: v / len(loader) for k, v in meters.items()}


def main(train_loader, epochs=24, device="cuda"):
    det = Detector(num_classes=20).to(device)
    optimizer = torch.optim.SGD(det.parameters(), lr=0.02, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[16, 22], gamma=0.1)
    weights = {"cls": 1.0, "box": 2.0, "obj": 1.0}
    for epoch in range(epochs):
        stats = train_epoch(det, train_loader, optimizer, device, weights, epoch)
        scheduler.step()
        print(f"epoch {epoch} done:", {k: round(v, 4) for k, v in stats.items()})
        torch.save(det.state_dict(), f"det_epoch{epoch}.pt")
