"""Online scoring: the recurrent state lives on the detector between readings."""
import torch
import torch.nn as nn


class Forecaster(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.cell = nn.GRUCell(n, n)
        self.head = nn.Linear(n, n)


class Detector:
    def __init__(self, model, n):
        self.model = model.eval()
        self.h = torch.zeros(1, n)  # one state per stream

    def step(self, x):
        self.h = self.model.cell(x, self.h.detach())  # next state
        return (self.model.head(self.h) - x).pow(2).mean().item()


def main():
    detector = Detector(Forecaster(32), 32)
    for x in torch.randn(100_000, 1, 32):
        print(detector.step(x))


if __name__ == "__main__":
    main()
