import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


def timestep_embedding(t, dim, max_period=10000):
    half = dim // 2
    freqs = torch.exp(-math.log(max_period) * torch.arange(half, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class QKVAttentionLegacy(nn.Module):
    def __init__(self, n_heads):
        super().__init__()
        self.n_heads = n_heads

    def forward(self, qkv):
        bs, width, length = qkv.shape
        ch = width // (3 * self.n_heads)
        q, k, v = qkv.reshape(bs * self.n_heads, ch * 3, length).split(ch, dim=1)
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
        return a.reshape(bs, -1, length)


class AttentionBlock(nn.Module):
    def __init__(self, channels, num_heads=4):
        super().__init__()
        self.norm = nn.GroupNorm(32, channels)
        self.qkv = nn.Conv1d(channels, channels * 3, 1)
        self.attention = QKVAttentionLegacy(num_heads)
        self.proj_out = nn.Conv1d(channels, channels, 1)

    def forward(self, x):
        b, c, *spatial = x.shape
        h = x.reshape(b, c, -1)
        h = self.proj_out(self.attention(self.qkv(self.norm(h))))
        return x + h.reshape(b, c, *spatial)


class ResBlock(nn.Module):
    def __init__(self, ch_in, ch_out, emb_dim):
        super().__init__()
        self.in_layers = nn.Sequential(nn.GroupNorm(32, ch_in), nn.SiLU(), nn.Conv2d(ch_in, ch_out, 3, padding=1))
        self.emb = nn.Linear(emb_dim, ch_out)
        self.out_layers = nn.Sequential(nn.GroupNorm(32, ch_out), nn.SiLU(), nn.Conv2d(ch_out, ch_out, 3, padding=1))
        self.skip = nn.Conv2d(ch_in, ch_out, 1) if ch_in != ch_out else nn.Identity()

    def forward(self, x, emb):
        h = self.in_layers(x) + self.emb(emb)[:, :, None, None]
        return self.skip(x) + self.out_layers(h)


class UNet(nn.Module):
    def __init__(self, ch=128, mults=(1, 1, 2, 2, 4), attn_at=(2, 3)):
        super().__init__()
        self.emb = nn.Sequential(nn.Linear(ch, 4 * ch), nn.SiLU(), nn.Linear(4 * ch, 4 * ch))
        self.inp = nn.Conv2d(3, ch, 3, padding=1)
        self.down, chans, c = nn.ModuleList(), [], ch
        for i, m in enumerate(mults):
            self.down.append(nn.ModuleList([ResBlock(c, ch * m, 4 * ch),
                                            AttentionBlock(ch * m) if i in attn_at else nn.Identity(),
                                            nn.Conv2d(ch * m, ch * m, 3, stride=2, padding=1)]))
            c = ch * m
            chans.append(c)
        self.up = nn.ModuleList()
        for i, m in reversed(list(enumerate(mults))):
            self.up.append(nn.ModuleList([ResBlock(c + chans[i], ch * m, 4 * ch),
                                          AttentionBlock(ch * m) if i in attn_at else nn.Identity()]))
            c = ch * m
        self.out = nn.Sequential(nn.GroupNorm(32, c), nn.SiLU(), nn.Conv2d(c, 3, 3, padding=1))
        self.ch = ch

    def forward(self, x, t):
        emb = self.emb(timestep_embedding(t, self.ch))
        h, skips = self.inp(x), []
        for res, attn, down in self.down:
            h = attn(res(h, emb))
            skips.append(h)
            h = down(h)
        for res, attn in self.up:
            h = F.interpolate(h, scale_factor=2, mode="nearest")
            h = attn(res(torch.cat([h, skips.pop()], dim=1), emb))
        return self.out(h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/datasets/ffhq256")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--steps", type=int, default=500_000)
    args = parser.parse_args()
    device = torch.device("cuda")
    tf = transforms.Compose([transforms.RandomHorizontalFlip(), transforms.ToTensor(), transforms.Normalize([0.5] * 3, [0.5] * 3)])
    loader = DataLoader(datasets.ImageFolder(args.data, tf), batch_size=args.batch_size, shuffle=True, num_workers=8, drop_last=True)
    model = UNet().to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    betas = torch.linspace(1e-4, 0.02, 1000, device=device)
    alphas_bar = torch.cumprod(1 - betas, dim=0)
    step = 0
    while step < args.steps:
        for x0, _ in loader:
            x0 = x0.to(device)
            t = torch.randint(0, 1000, (x0.size(0),), device=device)
            noise = torch.randn_like(x0)
            a = alphas_bar[t].view(-1, 1, 1, 1)
            loss = F.mse_loss(model(a.sqrt() * x0 + (1 - a).sqrt() * noise, t), noise)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            if step % 100 == 0:
                print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
