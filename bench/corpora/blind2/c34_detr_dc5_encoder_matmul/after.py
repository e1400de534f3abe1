"""DETR-DC5 encoder: self-attention over the stride-16 feature map."""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torchvision.models._utils import IntermediateLayerGetter


def sine_pos_embed(mask, num_pos_feats=128, temperature=10000):
    not_mask = ~mask
    y = not_mask.cumsum(1, dtype=torch.float32)
    x = not_mask.cumsum(2, dtype=torch.float32)
    y = y / (y[:, -1:, :] + 1e-6) * 2 * math.pi
    x = x / (x[:, :, -1:] + 1e-6) * 2 * math.pi
    dim_t = temperature ** (2 * (torch.arange(num_pos_feats, device=mask.device) // 2) / num_pos_feats)
    px, py = x[:, :, :, None] / dim_t, y[:, :, :, None] / dim_t
    px = torch.stack((px[..., 0::2].sin(), px[..., 1::2].cos()), dim=4).flatten(3)
    py = torch.stack((py[..., 0::2].sin(), py[..., 1::2].cos()), dim=4).flatten(3)
    return torch.cat((py, px), dim=3).permute(0, 3, 1, 2)


class EncoderSelfAttention(nn.Module):
    def __init__(self, d_model=256, nhead=8, dropout=0.1):
        super().__init__()
        self.nhead, self.dh = nhead, d_model // nhead
        self.q_proj = nn.Linear(d_model, d_model)
        self.k_proj = nn.Linear(d_model, d_model)
        self.v_proj = nn.Linear(d_model, d_model)
        self.o_proj = nn.Linear(d_model, d_model)
        self.drop = nn.Dropout(dropout)

    def _heads(self, t):
        B, N, _ = t.shape
        return t.view(B, N, self.nhead, self.dh).permute(0, 2, 1, 3)

    def forward(self, src, pos, key_padding_mask):
        q = self._heads(self.q_proj(src + pos)) / math.sqrt(self.dh)
        k = self._heads(self.k_proj(src + pos))
        v = self._heads(self.v_proj(src))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=~key_padding_mask[:, None, None, :],
                                             dropout_p=self.drop.p if self.training else 0.0, scale=1.0)
        out = out.permute(0, 2, 1, 3).flatten(2)
        return self.o_proj(out)


class EncoderLayer(nn.Module):
    def __init__(self, d_model=256, nhead=8, dim_ff=2048, dropout=0.1):
        super().__init__()
        self.self_attn = EncoderSelfAttention(d_model, nhead, dropout)
        self.ff = nn.Sequential(nn.Linear(d_model, dim_ff), nn.ReLU(), nn.Dropout(dropout), nn.Linear(dim_ff, d_model))
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, src, pos, mask):
        src = self.norm1(src + self.dropout(self.self_attn(src, pos, mask)))
        return self.norm2(src + self.dropout(self.ff(src)))


class DETREncoderDC5(nn.Module):
    def __init__(self, d_model=256, num_layers=6):
        super().__init__()
        resnet = torchvision.models.resnet50(weights="IMAGENET1K_V2",
                                             replace_stride_with_dilation=[False, False, True])
        self.backbone = IntermediateLayerGetter(resnet, return_layers={"layer4": "0"})
        self.input_proj = nn.Conv2d(2048, d_model, 1)
        self.layers = nn.ModuleList([EncoderLayer(d_model) for _ in range(num_layers)])

    def forward(self, images, pixel_mask):
        feat = self.backbone(images)["0"]
        mask = F.interpolate(pixel_mask[None].float(), size=feat.shape[-2:])[0].bool()
        pos = sine_pos_embed(mask).flatten(2).transpose(1, 2)
        src = self.input_proj(feat).flatten(2).transpose(1, 2)
        mask = mask.flatten(1)
        for layer in self.layers:
            src = layer(src, pos, mask)
        return src, mask, pos


if __name__ == "__main__":
    device = torch.device("cuda")
    encoder = DETREncoderDC5().to(device).train()
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=1e-4, weight_decay=1e-4)
    # COCO-style batch: images padded to the largest in the batch (max side 1333)
    images = torch.randn(4, 3, 1088, 1333, device=device)
    pixel_mask = torch.zeros(4, 1088, 1333, dtype=torch.bool, device=device)
    pixel_mask[1, :, 1000:] = True
    memory, mask, pos = encoder(images, pixel_mask)
    memory.float().pow(2).mean().backward()
    optimizer.step()
    print(memory.shape, torch.cuda.max_memory_allocated() / 2**30)
