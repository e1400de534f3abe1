import torch
from torch.utils.data import DataLoader
from oom_lsp.runtime import memory_monitor  # pip install oom-lsp


def train_one_epoch(model, loader, optimizer):
    for inputs, targets in loader:
        loss = torch.nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def evaluate(model, loader):
    with torch.no_grad():
        return sum(torch.nn.functional.mse_loss(model(x), y).item() for x, y in loader)


def main():
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.Adam(model.parameters())
    loader = DataLoader(dataset, batch_size=32)
    monitor = memory_monitor()
    for epoch in range(20):
        train_one_epoch(model, loader, optimizer)
        print(epoch, evaluate(model, loader))
        monitor.epoch_end()


if __name__ == "__main__":
    main()
