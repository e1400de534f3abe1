"""A small MLP trained with AdamW: what "Estimate peak memory" measures in the e2e."""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main():
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = TensorDataset(torch.randn(256, 128), torch.randint(0, 10, (256,)))
    loader = DataLoader(data, batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16):
            loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
