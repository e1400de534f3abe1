import argparse

import torch
from oom_lsp.runtime import oom_guard  # pip install oom-lsp


def fit(model, loader, optimizer, epochs):
    for _ in range(epochs):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    model, loader, optimizer = build()
    with oom_guard():
        fit(model, loader, optimizer, args.epochs)  # the long part


if __name__ == "__main__":
    main()
