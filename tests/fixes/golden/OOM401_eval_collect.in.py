"""Collect predictions and labels over a validation set."""

import torch
from torch import nn


@torch.no_grad()
def evaluate(model: nn.Module, loader, device="cuda"):
    model.eval()
    preds = torch.empty(0, dtype=torch.long, device=device)
    labels = torch.empty(0, dtype=torch.long, device=device)
    for images, targets in loader:
        images = images.to(device, non_blocking=True)
        logits = model(images)
        # argmax over classes
        preds = torch.cat([preds, logits.argmax(dim=1)])
        labels = torch.cat([labels, targets.to(device)])  # ground truth
    accuracy = (preds == labels).float().mean().item()
    return accuracy
