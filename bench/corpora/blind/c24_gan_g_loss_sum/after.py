import os

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader
from torchvision import datasets, transforms
from torchvision.utils import save_image

latent_dim, img_shape = 100, (1, 28, 28)
cuda = torch.cuda.is_available()
Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor


class Generator(nn.Module):
    def __init__(self):
        super().__init__()

        def block(in_feat, out_feat, normalize=True):
            layers = [nn.Linear(in_feat, out_feat)]
            if normalize:
                layers.append(nn.BatchNorm1d(out_feat, 0.8))
            layers.append(nn.LeakyReLU(0.2, inplace=True))
            return layers

        self.model = nn.Sequential(*block(latent_dim, 128, normalize=False), *block(128, 256),
                                   *block(256, 512), *block(512, 1024),
                                   nn.Linear(1024, int(np.prod(img_shape))), nn.Tanh())

    def forward(self, z):
        return self.model(z).view(z.size(0), *img_shape)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Sequential(nn.Linear(int(np.prod(img_shape)), 512), nn.LeakyReLU(0.2, inplace=True),
                                   nn.Linear(512, 256), nn.LeakyReLU(0.2, inplace=True),
                                   nn.Linear(256, 1), nn.Sigmoid())

    def forward(self, img):
        return self.model(img.view(img.size(0), -1))


os.makedirs("images", exist_ok=True)
adversarial_loss = nn.BCELoss()
generator, discriminator = Generator(), Discriminator()
if cuda:
    generator.cuda(), discriminator.cuda(), adversarial_loss.cuda()
dataloader = DataLoader(datasets.MNIST("data/mnist", train=True, download=True, transform=transforms.Compose(
    [transforms.ToTensor(), transforms.Normalize([0.5], [0.5])])), batch_size=64, shuffle=True)
optimizer_G = torch.optim.Adam(generator.parameters(), lr=2e-4, betas=(0.5, 0.999))
optimizer_D = torch.optim.Adam(discriminator.parameters(), lr=2e-4, betas=(0.5, 0.999))

for epoch in range(200):
    g_loss_sum, d_loss_sum = 0.0, 0.0
    for i, (imgs, _) in enumerate(dataloader):
        valid = Tensor(imgs.size(0), 1).fill_(1.0)
        fake = Tensor(imgs.size(0), 1).fill_(0.0)
        real_imgs = imgs.type(Tensor)

        optimizer_G.zero_grad()
        z = Tensor(np.random.normal(0, 1, (imgs.shape[0], latent_dim)))
        gen_imgs = generator(z)
        g_loss = adversarial_loss(discriminator(gen_imgs), valid)
        g_loss.backward()
        optimizer_G.step()

        optimizer_D.zero_grad()
        real_loss = adversarial_loss(discriminator(real_imgs), valid)
        fake_loss = adversarial_loss(discriminator(gen_imgs.detach()), fake)
        d_loss = (real_loss + fake_loss) / 2
        d_loss.backward()
        optimizer_D.step()

        g_loss_sum += g_loss.item()
        d_loss_sum += d_loss.item()
        if i % 400 == 0:
            save_image(gen_imgs.data[:25], f"images/{epoch:03d}_{i:04d}.png", nrow=5, normalize=True)

    n = len(dataloader)
    print(f"[Epoch {epoch}/200] [D loss: {d_loss_sum / n:.4f}] [G loss: {g_loss_sum / n:.4f}]")
