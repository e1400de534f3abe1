"""Inference helpers."""
from torch import nn

net = nn.Linear(8, 2)


def infer(batch):
    net.eval()
    return net(batch).softmax(-1)
