"""Train a small classifier and report per-epoch statistics."""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader


class MLP(nn.Module):
    def __init__(self, width: int = 256) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(784, width), nn.ReLU(), nn.Linear(width, 10))

    def forward(self, x):
        return self.layers(x.flatten(1))


def train_epoch(net: MLP, loader: DataLoader, optimizer, writer, epoch: int) -> torch.Tensor:
    net.train()
    running_loss = 0.0
    total_loss = torch.zeros((), device="cuda")
    for step, (images, labels) in enumerate(loader):
        logits = net(images.cuda())
        loss = F.cross_entropy(logits, labels.cuda())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

        running_loss += loss  # for the progress bar
        total_loss = total_loss + loss * images.size(0)
        if step % 100 == 99:
            writer.add_scalar("train/loss", running_loss / 100, epoch * len(loader) + step)
            print(f"step {step + 1}: {running_loss / 100:.4f}")
            running_loss = 0.0
    # The caller keeps a tensor.
    return total_loss / len(loader.dataset)


def main() -> None:
    net = MLP().cuda()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    loader = DataLoader(dataset, batch_size=32, shuffle=True)
    for epoch in range(10):
        epoch_loss = train_epoch(net, loader, optimizer, writer, epoch)
        print(f"epoch {epoch}: {epoch_loss.item():.4f}")
