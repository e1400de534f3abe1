"""BEiT-style backbone with relative position bias for high-resolution semantic segmentation."""
import glob

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image


class RelPosAttention(nn.Module):
    def __init__(self, dim, num_heads, grid, attn_drop=0.0):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=True)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(attn_drop)
        gh, gw = grid
        self.rel_table = nn.Parameter(torch.zeros((2 * gh - 1) * (2 * gw - 1), num_heads))
        coords = torch.stack(torch.meshgrid(torch.arange(gh), torch.arange(gw), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0)
        rel[:, :, 0] += gh - 1
        rel[:, :, 1] += gw - 1
        self.register_buffer("rel_index", rel[:, :, 0] * (2 * gw - 1) + rel[:, :, 1], persistent=False)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        bias = self.rel_table[self.rel_index.view(-1)].view(N, N, -1).permute(2, 0, 1)
        x = F.scaled_dot_product_attention(q, k, v, attn_mask=bias.unsqueeze(0).to(q.dtype),
                                           dropout_p=self.attn_drop.p if self.training else 0.0)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj(x)


class Block(nn.Module):
    def __init__(self, dim, num_heads, grid, drop_path=0.0, init_values=0.1):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=1e-6)
        self.attn = RelPosAttention(dim, num_heads, grid)
        self.norm2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.gamma_1 = nn.Parameter(init_values * torch.ones(dim))
        self.gamma_2 = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        x = x + self.gamma_1 * self.attn(self.norm1(x))
        return x + self.gamma_2 * self.mlp(self.norm2(x))


class BEiTSeg(nn.Module):
    def __init__(self, img_size=1024, patch=16, dim=768, depth=12, heads=12, num_classes=150):
        super().__init__()
        self.grid = (img_size // patch, img_size // patch)
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.blocks = nn.ModuleList([Block(dim, heads, self.grid) for _ in range(depth)])
        self.out_indices = (3, 5, 7, 11)
        self.fuse = nn.Conv2d(dim * len(self.out_indices), 512, 1)
        self.cls = nn.Sequential(nn.BatchNorm2d(512), nn.ReLU(), nn.Conv2d(512, num_classes, 1))

    def forward(self, img):
        x = self.patch_embed(img)
        B, C, H, W = x.shape
        x = x.flatten(2).transpose(1, 2)
        feats = []
        for i, blk in enumerate(self.blocks):
            x = blk(x)
            if i in self.out_indices:
                feats.append(x.transpose(1, 2).reshape(B, C, H, W))
        logits = self.cls(self.fuse(torch.cat(feats, dim=1)))
        return F.interpolate(logits, size=img.shape[-2:], mode="bilinear", align_corners=False)


def train_step(model, optimizer, images, masks):
    model.train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = model(images)
        loss = F.cross_entropy(logits, masks, ignore_index=255)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.item()


class ADEHighRes(torch.utils.data.Dataset):
    def __init__(self, root, size=1024):
        self.images = sorted(glob.glob(f"{root}/images/training/*.jpg"))
        self.size = size

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        img = Image.open(self.images[i]).convert("RGB").resize((self.size, self.size), Image.BILINEAR)
        ann = Image.open(self.images[i].replace("images", "annotations").replace(".jpg", ".png"))
        ann = np.array(ann.resize((self.size, self.size), Image.NEAREST), dtype=np.int64) - 1
        ann[ann < 0] = 255
        x = torch.from_numpy(np.array(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
        x = (x - torch.tensor([0.5, 0.5, 0.5])[:, None, None]) / 0.5
        return x, torch.from_numpy(ann)


if __name__ == "__main__":
    device = torch.device("cuda")
    model = BEiTSeg().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-5, weight_decay=0.05)
    loader = torch.utils.data.DataLoader(ADEHighRes("/datasets/ADEChallengeData2016"), batch_size=2,
                                         shuffle=True, num_workers=8, drop_last=True)
    it = 0
    while it < 160_000:
        for images, masks in loader:
            loss = train_step(model, optimizer, images.to(device), masks.to(device))
            if it % 50 == 0:
                print(f"iter {it} loss {loss:.4f}")
            it += 1
