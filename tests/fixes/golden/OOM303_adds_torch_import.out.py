"""Inference helpers."""
from torch import nn
import torch

net = nn.Linear(8, 2)


@torch.inference_mode()
def infer(batch):
    net.eval()
    return net(batch).softmax(-1)
