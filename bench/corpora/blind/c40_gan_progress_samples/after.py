import argparse

import imageio
import numpy as np
import torch
import torch.nn as nn
import torchvision.utils as vutils

from networks import ConvDiscriminator, ConvGenerator
from data import get_celeba_loader


def hinge_d_loss(real_logits, fake_logits):
    return torch.relu(1.0 - real_logits).mean() + torch.relu(1.0 + fake_logits).mean()


def make_gif(sample_history, path, nrow=8):
    frames = []
    for batch in sample_history:
        grid = vutils.make_grid(batch.detach().cpu(), nrow=nrow, normalize=True, value_range=(-1, 1))
        frames.append((grid.permute(1, 2, 0).numpy() * 255).astype(np.uint8))
    imageio.mimsave(path, frames, duration=0.2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--z-dim", type=int, default=128)
    ap.add_argument("--snapshot-every", type=int, default=250)
    args = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    loader = get_celeba_loader(batch_size=64, image_size=64)
    gen = ConvGenerator(args.z_dim).to(device)
    disc = ConvDiscriminator().to(device)
    opt_g = torch.optim.Adam(gen.parameters(), lr=2e-4, betas=(0.0, 0.9))
    opt_d = torch.optim.Adam(disc.parameters(), lr=2e-4, betas=(0.0, 0.9))
    sample_history = []
    it = 0

    for epoch in range(args.epochs):
        for real, _ in loader:
            real = real.to(device)
            z = torch.randn(real.size(0), args.z_dim, device=device)
            fake = gen(z)

            opt_d.zero_grad()
            d_loss = hinge_d_loss(disc(real), disc(fake.detach()))
            d_loss.backward()
            opt_d.step()

            opt_g.zero_grad()
            g_loss = -disc(fake).mean()
            g_loss.backward()
            opt_g.step()

            if it % args.snapshot_every == 0:
                sample_history.append(fake[:64].detach().cpu())
                print(f"epoch {epoch} it {it}: d {d_loss.item():.3f} g {g_loss.item():.3f}")
            it += 1

        torch.save({"gen": gen.state_dict(), "disc": disc.state_dict()}, f"ckpt_{epoch:03d}.pt")
    make_gif(sample_history, "progress.gif")


if __name__ == "__main__":
    main()
