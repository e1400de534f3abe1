import torch
from oom_lsp.runtime import memory_monitor  # pip install oom-lsp


def train_step(model, optimizer, batch):
    inputs, targets = batch
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def fit(model, optimizer, loader, epochs):
    monitor = memory_monitor()
    for epoch in range(epochs):
        for batch in loader:
            last = train_step(model, optimizer, batch)
            if last > 10:
                print("diverging", epoch, last)
            monitor.step()
        monitor.epoch_end()
