"""Train a small classifier; every knob is a flag (defaults tuned on an A100)."""

import argparse
from dataclasses import dataclass

import torch
from torch.utils.data import DataLoader as Loader

NUM_WORKERS = 4
BATCH_SIZE = 256  # the README promises this number


@dataclass
class OptimConfig:
    lr: float = 3e-4
    micro_batch_size: int = 128  # per GPU
    eval_batch_size: int = 1024  # evaluation keeps no activations


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--batch-size",
        type=int,
        default=512,  # per step
        help="samples per training step",
    )
    parser.add_argument("--test-batch-size", type=int, default=2048)
    parser.add_argument("--epochs", type=int, default=90)
    return parser.parse_args()


def loaders(train_set, test_set):
    train = Loader(
        train_set,
        batch_size=BATCH_SIZE,
        shuffle=True,
        num_workers=NUM_WORKERS,
    )
    test = Loader(test_set, batch_size=1000)
    return train, test


sweep = {"lr": [1e-3, 3e-4], "batch_size": 64, "warmup": 500}
