"""Point-cloud transformer for semantic segmentation of outdoor LiDAR blocks."""
import argparse

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class LidarBlocks(Dataset):
    def __init__(self, root, split, num_points=16384):
        self.files = sorted(np.loadtxt(f"{root}/{split}.txt", dtype=str))
        self.root, self.num_points = root, num_points

    def __len__(self):
        return len(self.files)

    def __getitem__(self, i):
        block = np.load(f"{self.root}/blocks/{self.files[i]}")
        idx = np.random.choice(len(block), self.num_points, replace=len(block) < self.num_points)
        pts = block[idx]
        xyz = pts[:, :3] - pts[:, :3].mean(0)
        feats = np.concatenate([xyz, pts[:, 3:6] / 255.0, pts[:, 6:7]], axis=1).astype(np.float32)
        return torch.from_numpy(feats).t(), torch.from_numpy(pts[:, 7].astype(np.int64))


class GlobalPointAttention(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.q_conv = nn.Conv1d(channels, channels // 4, 1, bias=False)
        self.k_conv = nn.Conv1d(channels, channels // 4, 1, bias=False)
        self.v_conv = nn.Conv1d(channels, channels, 1)
        self.trans_conv = nn.Conv1d(channels, channels, 1)
        self.after_norm = nn.BatchNorm1d(channels)
        self.scale = (channels // 4) ** -0.5

    def forward(self, x):
        x_q = self.q_conv(x).permute(0, 2, 1)
        x_k = self.k_conv(x)
        x_v = self.v_conv(x)
        energy = torch.bmm(x_q, x_k) * self.scale
        attention = torch.softmax(energy, dim=-1)
        x_r = torch.bmm(x_v, attention.permute(0, 2, 1))
        return x + F.relu(self.after_norm(self.trans_conv(x_r)))


class PointSegNet(nn.Module):
    def __init__(self, in_ch=7, num_classes=13, channels=256, blocks=4):
        super().__init__()
        self.embed = nn.Sequential(nn.Conv1d(in_ch, 128, 1), nn.BatchNorm1d(128), nn.ReLU(),
                                   nn.Conv1d(128, channels, 1), nn.BatchNorm1d(channels), nn.ReLU())
        self.blocks = nn.ModuleList([GlobalPointAttention(channels) for _ in range(blocks)])
        self.fuse = nn.Sequential(nn.Conv1d(channels * blocks, 1024, 1), nn.BatchNorm1d(1024), nn.LeakyReLU(0.2))
        self.head = nn.Sequential(nn.Conv1d(1024 * 2, 512, 1), nn.BatchNorm1d(512), nn.ReLU(), nn.Dropout(0.5),
                                  nn.Conv1d(512, num_classes, 1))

    def forward(self, pts):
        x = self.embed(pts)
        outs = []
        for blk in self.blocks:
            x = blk(x)
            outs.append(x)
        x = self.fuse(torch.cat(outs, dim=1))
        glob = x.max(dim=-1, keepdim=True).values.expand_as(x)
        return self.head(torch.cat([x, glob], dim=1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default="/data/semantic3d_blocks")
    parser.add_argument("--num_points", type=int, default=16384)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=100)
    args = parser.parse_args()

    device = torch.device("cuda")
    loader = DataLoader(LidarBlocks(args.root, "train", args.num_points), batch_size=args.batch_size,
                        shuffle=True, num_workers=8, drop_last=True)
    model = PointSegNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.epochs)
    for epoch in range(args.epochs):
        model.train()
        for it, (pts, labels) in enumerate(loader):
            logits = model(pts.to(device))
            loss = F.cross_entropy(logits, labels.to(device), label_smoothing=0.2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if it % 20 == 0:
                print(f"epoch {epoch} it {it} loss {loss.item():.4f}")
        scheduler.step()


if __name__ == "__main__":
    main()
