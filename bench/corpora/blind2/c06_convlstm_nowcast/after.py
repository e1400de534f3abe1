import argparse
import os
from glob import glob

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class RadarArchive(Dataset):
    """Consecutive 5-minute radar reflectivity frames, kept in time order."""

    def __init__(self, root, size=512):
        self.files = sorted(glob(os.path.join(root, "*.npy")))
        self.size = size

    def __len__(self):
        return len(self.files)

    def __getitem__(self, idx):
        frame = np.load(self.files[idx]).astype(np.float32)[: self.size, : self.size]
        return torch.from_numpy(np.clip(frame, 0, 70) / 70.0).unsqueeze(0), os.path.basename(self.files[idx])


class ConvLSTMCell(nn.Module):
    def __init__(self, in_ch, hid_ch, k=3):
        super().__init__()
        self.hid_ch = hid_ch
        self.conv = nn.Conv2d(in_ch + hid_ch, 4 * hid_ch, k, padding=k // 2)

    def forward(self, x, state):
        h, c = state
        i, f, o, g = self.conv(torch.cat([x, h], dim=1)).chunk(4, dim=1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        return h, c


class Nowcaster(nn.Module):
    def __init__(self, hidden=(64, 128)):
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(1, 32, 4, stride=2, padding=1), nn.LeakyReLU(0.2),
                                  nn.Conv2d(32, 64, 4, stride=2, padding=1), nn.LeakyReLU(0.2))
        self.cells = nn.ModuleList([ConvLSTMCell(64, hidden[0]), ConvLSTMCell(hidden[0], hidden[1])])
        self.up = nn.Sequential(nn.ConvTranspose2d(hidden[1], 32, 4, stride=2, padding=1), nn.LeakyReLU(0.2),
                                nn.ConvTranspose2d(32, 1, 4, stride=2, padding=1))

    def init_states(self, batch, height, width, device):
        return [(torch.zeros(batch, c.hid_ch, height // 4, width // 4, device=device),
                 torch.zeros(batch, c.hid_ch, height // 4, width // 4, device=device)) for c in self.cells]

    def forward(self, frame, states):
        x = self.down(frame)
        new_states = []
        for cell, st in zip(self.cells, states):
            h, c = cell(x, st)
            new_states.append((h, c))
            x = h
        return torch.sigmoid(self.up(x)), new_states


def main():
    parser = argparse.ArgumentParser(description="Run the nowcasting model over a radar archive")
    parser.add_argument("--archive", default="/data/radar/2022")
    parser.add_argument("--ckpt", default="runs/nowcast/best.pth")
    parser.add_argument("--out_dir", default="predictions/2022")
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--workers", type=int, default=8)
    args = parser.parse_args()

    device = torch.device("cuda")
    model = Nowcaster()
    model.load_state_dict(torch.load(args.ckpt, map_location="cpu")["model"])
    model.to(device).eval()

    loader = DataLoader(RadarArchive(args.archive, args.size), batch_size=1, shuffle=False,
                        num_workers=args.workers, pin_memory=True)
    os.makedirs(args.out_dir, exist_ok=True)
    states = model.init_states(1, args.size, args.size, device)
    for step, (frame, name) in enumerate(loader):
        states = [(h.detach(), c.detach()) for h, c in states]
        frame = frame.to(device, non_blocking=True)
        pred, states = model(frame, states)
        np.save(os.path.join(args.out_dir, name[0]), (pred[0, 0].detach() * 70.0).cpu().numpy().astype(np.float16))
        if step % 1000 == 0:
            print(f"[{step}/{len(loader)}] {name[0]}")


if __name__ == "__main__":
    main()
