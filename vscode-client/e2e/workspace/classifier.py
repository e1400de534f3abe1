"""A classifier trained in float32, the batch moved to the GPU in the loop."""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    data = TensorDataset(torch.randn(8192, 1024), torch.randint(0, 10, (8192,)))
    loader = DataLoader(data, batch_size=2048)
    model = nn.Sequential(
        nn.Linear(1024, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 10)
    ).cuda()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for x, y in loader:
        x = x.cuda()
        y = y.cuda()
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
