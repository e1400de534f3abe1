import math

import torch
import torch.nn.functional as F
from torch import nn


class MultiHeadAttention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        # (B, H, T, T) attention scores
        scores = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        weights = F.softmax(scores, dim=-1)
        context = torch.matmul(weights, v)  # (B, H, T, D)
        return self.proj(context.transpose(1, 2).reshape(B, T, C))


class CrossAttention(nn.Module):
    def forward(self, q, k, v):
        attn = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5
        attn = attn.softmax(dim=-1)
        attn = self.dropout(attn)  # dropout between: no fix
        return attn @ v
