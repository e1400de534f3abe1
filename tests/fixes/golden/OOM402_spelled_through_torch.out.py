"""Scaled dot-product attention, written out."""
import torch


def attention(query, key, value):
    return torch.nn.functional.scaled_dot_product_attention(query, key, value)
