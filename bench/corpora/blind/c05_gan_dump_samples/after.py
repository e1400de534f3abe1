import argparse
import os

import torch
import torch.nn as nn
import torchvision.utils as vutils
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from models import Discriminator, Generator, weights_init

nz = 100


def dump_samples(netG, out_dir, n_samples, batch_size, device):
    """Write n_samples generated images to disk so pytorch-fid can score them."""
    os.makedirs(out_dir, exist_ok=True)
    netG.eval()
    idx = 0
    with torch.no_grad():
        while idx < n_samples:
            n = min(batch_size, n_samples - idx)
            z = torch.randn(n, nz, 1, 1, device=device)
            fake = netG(z)
            fake = (fake + 1) / 2
            for img in fake:
                vutils.save_image(img, os.path.join(out_dir, f"{idx:06d}.png"))
                idx += 1
    netG.train()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dataroot", required=True)
    p.add_argument("--epochs", type=int, default=25)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--fid-every", type=int, default=5)
    args = p.parse_args()

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    dataset = datasets.ImageFolder(args.dataroot, transform=transforms.Compose([
        transforms.Resize(64), transforms.CenterCrop(64), transforms.ToTensor(),
        transforms.Normalize((0.5, 0.5, 0.5), (0.5, 0.5, 0.5)),
    ]))
    loader = DataLoader(dataset, batch_size=args.batch_size, shuffle=True, num_workers=2)

    netG = Generator(nz).to(device)
    netD = Discriminator().to(device)
    netG.apply(weights_init)
    netD.apply(weights_init)
    criterion = nn.BCELoss()
    optD = torch.optim.Adam(netD.parameters(), lr=args.lr, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=args.lr, betas=(0.5, 0.999))

    for epoch in range(args.epochs):
        for i, (real, _) in enumerate(loader):
            real = real.to(device)
            b = real.size(0)
            ones = torch.ones(b, device=device)
            zeros = torch.zeros(b, device=device)

            netD.zero_grad()
            errD_real = criterion(netD(real).view(-1), ones)
            noise = torch.randn(b, nz, 1, 1, device=device)
            fake = netG(noise)
            errD_fake = criterion(netD(fake.detach()).view(-1), zeros)
            errD = errD_real + errD_fake
            errD.backward()
            optD.step()

            netG.zero_grad()
            errG = criterion(netD(fake).view(-1), ones)
            errG.backward()
            optG.step()

            if i % 100 == 0:
                print(f"[{epoch}/{args.epochs}][{i}/{len(loader)}] "
                      f"Loss_D {errD.item():.4f} Loss_G {errG.item():.4f}")

        if (epoch + 1) % args.fid_every == 0:
            dump_samples(netG, f"samples/epoch_{epoch + 1}", 10000, 250, device)
            torch.save(netG.state_dict(), f"netG_epoch_{epoch + 1}.pth")


if __name__ == "__main__":
    main()
