"""Track per-example training loss to find mislabeled / hard examples (loss-based data pruning)."""
import json

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class IndexedDataset(Dataset):
    def __init__(self, base):
        self.base = base

    def __len__(self):
        return len(self.base)

    def __getitem__(self, i):
        x, y = self.base[i]
        return x, y, i


def train_with_loss_tracking(net, base_dataset, epochs=30, lr=0.1, device="cuda"):
    loader = DataLoader(IndexedDataset(base_dataset), batch_size=256, shuffle=True, num_workers=8)
    optimizer = torch.optim.SGD(net.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4, nesterov=True)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=epochs * len(loader))
    net.to(device)
    history = []

    for epoch in range(epochs):
        net.train()
        sample_losses, sample_ids = [], []
        for x, y, idx in loader:
            x, y = x.to(device), y.to(device)
            logits = net(x)
            per_sample = F.cross_entropy(logits, y, reduction="none")
            loss = per_sample.mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
            sample_losses.extend(per_sample)
            sample_ids.extend(idx.tolist())

        epoch_losses = np.zeros(len(base_dataset), dtype=np.float32)
        epoch_losses[sample_ids] = [float(l) for l in sample_losses]
        history.append(epoch_losses)
        print(f"epoch {epoch}: mean loss {epoch_losses.mean():.4f}")

    mean_curve = np.stack(history).mean(axis=0)
    hardest = np.argsort(-mean_curve)[:1000]
    with open("hard_examples.json", "w") as f:
        json.dump({"indices": hardest.tolist(), "scores": mean_curve[hardest].tolist()}, f)
    return net, mean_curve


class SmallResNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        self.layer = nn.Sequential(nn.Conv2d(64, 128, 3, stride=2, padding=1, bias=False),
                                   nn.BatchNorm2d(128), nn.ReLU(),
                                   nn.Conv2d(128, 256, 3, stride=2, padding=1, bias=False),
                                   nn.BatchNorm2d(256), nn.ReLU())
        self.fc = nn.Linear(256, num_classes)

    def forward(self, x):
        return self.fc(F.adaptive_avg_pool2d(self.layer(self.stem(x)), 1).flatten(1))
