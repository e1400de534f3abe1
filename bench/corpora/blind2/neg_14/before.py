"""Swin-style window attention block (7x7 local windows) used in a segmentation backbone."""
import torch
import torch.nn as nn


def window_partition(x, ws):
    B, H, W, C = x.shape
    x = x.view(B, H // ws, ws, W // ws, ws, C)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, C)


def window_reverse(windows, ws, H, W):
    B = windows.shape[0] // ((H // ws) * (W // ws))
    x = windows.view(B, H // ws, W // ws, ws, ws, -1)
    return x.permute(0, 1, 3, 2, 4, 5).reshape(B, H, W, -1)


class WindowAttention(nn.Module):
    def __init__(self, dim, window_size, num_heads, attn_drop=0.0):
        super().__init__()
        self.ws, self.num_heads = window_size, num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(attn_drop)
        self.rel_bias = nn.Parameter(torch.zeros((2 * window_size - 1) ** 2, num_heads))
        coords = torch.stack(torch.meshgrid(torch.arange(window_size), torch.arange(window_size), indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (window_size - 1)
        self.register_buffer("rel_index", rel[..., 0] * (2 * window_size - 1) + rel[..., 1], persistent=False)
        nn.init.trunc_normal_(self.rel_bias, std=0.02)

    def forward(self, x, mask=None):
        Bw, N, C = x.shape
        q, k, v = self.qkv(x).reshape(Bw, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        attn = attn + self.rel_bias[self.rel_index.view(-1)].view(N, N, -1).permute(2, 0, 1).unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn = attn.view(Bw // nw, nw, self.num_heads, N, N) + mask[None, :, None]
            attn = attn.view(-1, self.num_heads, N, N)
        attn = self.attn_drop(attn.softmax(dim=-1))
        return self.proj((attn @ v).transpose(1, 2).reshape(Bw, N, C))


class SwinBlock(nn.Module):
    def __init__(self, dim, num_heads, window_size=7, shift=0):
        super().__init__()
        self.ws, self.shift = window_size, shift
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, window_size, num_heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def attn_mask(self, H, W, device):
        if self.shift == 0:
            return None
        img = torch.zeros(1, H, W, 1, device=device)
        cnt = 0
        for hs in (slice(0, -self.ws), slice(-self.ws, -self.shift), slice(-self.shift, None)):
            for wsl in (slice(0, -self.ws), slice(-self.ws, -self.shift), slice(-self.shift, None)):
                img[:, hs, wsl, :] = cnt
                cnt += 1
        win = window_partition(img, self.ws).squeeze(-1)
        diff = win[:, None, :] - win[:, :, None]
        return diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0)

    def forward(self, x, H, W):
        B, L, C = x.shape
        h = self.norm1(x).view(B, H, W, C)
        if self.shift:
            h = torch.roll(h, (-self.shift, -self.shift), dims=(1, 2))
        h = self.attn(window_partition(h, self.ws), self.attn_mask(H, W, x.device))
        h = window_reverse(h, self.ws, H, W)
        if self.shift:
            h = torch.roll(h, (self.shift, self.shift), dims=(1, 2))
        x = x + h.reshape(B, L, C)
        return x + self.mlp(self.norm2(x))


if __name__ == "__main__":
    stage = nn.ModuleList([SwinBlock(128, 4, 7, shift=0 if i % 2 == 0 else 3) for i in range(2)]).cuda()
    feats = torch.randn(8, 112 * 112, 128, device="cuda", requires_grad=True)
    out = feats
    for blk in stage:
        out = blk(out, 112, 112)
    out.mean().backward()
    print(out.shape, f"{torch.cuda.max_memory_allocated() / 2**20:.0f} MiB")
