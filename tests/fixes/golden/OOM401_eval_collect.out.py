"""Collect predictions and labels over a validation set."""

import torch
from torch import nn


@torch.no_grad()
def evaluate(model: nn.Module, loader, device="cuda"):
    model.eval()
    preds = torch.empty(0, dtype=torch.long, device=device)
    labels = torch.empty(0, dtype=torch.long, device=device)
    preds_parts = [preds]
    labels_parts = [labels]
    for images, targets in loader:
        images = images.to(device, non_blocking=True)
        logits = model(images)
        # argmax over classes
        preds_parts.append(logits.argmax(dim=1))
        labels_parts.append(targets.to(device))  # ground truth
    labels = torch.cat(labels_parts)
    preds = torch.cat(preds_parts)
    accuracy = (preds == labels).float().mean().item()
    return accuracy
