import argparse

import torch
import torch.nn.functional as F
from torch import nn, optim
from torchvision import datasets, transforms
from torchvision.utils import save_image


class VAE(nn.Module):
    def __init__(self, latent=20):
        super().__init__()
        self.fc1 = nn.Linear(784, 400)
        self.fc21 = nn.Linear(400, latent)
        self.fc22 = nn.Linear(400, latent)
        self.fc3 = nn.Linear(latent, 400)
        self.fc4 = nn.Linear(400, 784)

    def encode(self, x):
        h1 = F.relu(self.fc1(x))
        return self.fc21(h1), self.fc22(h1)

    def reparameterize(self, mu, logvar):
        std = torch.exp(0.5 * logvar)
        return mu + torch.randn_like(std) * std

    def decode(self, z):
        return torch.sigmoid(self.fc4(F.relu(self.fc3(z))))

    def forward(self, x):
        mu, logvar = self.encode(x.view(-1, 784))
        return self.decode(self.reparameterize(mu, logvar)), mu, logvar


def vae_loss(recon_x, x, mu, logvar, beta=1.0):
    recon = F.binary_cross_entropy(recon_x, x.view(-1, 784), reduction="sum")
    kld = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
    return recon + beta * kld, recon, kld


def train_epoch(vae, loader, optimizer, device, epoch, beta):
    vae.train()
    train_loss = train_recon = train_kld = 0.0
    for batch_idx, (data, _) in enumerate(loader):
        data = data.to(device)
        optimizer.zero_grad()
        recon_batch, mu, logvar = vae(data)
        loss, recon, kld = vae_loss(recon_batch, data, mu, logvar, beta)
        loss.backward()
        optimizer.step()
        train_loss += loss.item()
        train_recon += recon
        train_kld += kld.item()
        if batch_idx % 100 == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.dataset)}]"
                  f"\tLoss: {loss.item() / len(data):.6f}")
    n = len(loader.dataset)
    return train_loss / n, float(train_recon) / n, train_kld / n


def main():
    parser = argparse.ArgumentParser(description="VAE MNIST Example")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--beta", type=float, default=1.0)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = torch.utils.data.DataLoader(
        datasets.MNIST("../data", train=True, download=True, transform=transforms.ToTensor()),
        batch_size=args.batch_size, shuffle=True)
    vae = VAE().to(device)
    optimizer = optim.Adam(vae.parameters(), lr=1e-3)
    for epoch in range(1, args.epochs + 1):
        total, rec, kl = train_epoch(vae, loader, optimizer, device, epoch, args.beta)
        print(f"====> Epoch {epoch} loss {total:.4f} (recon {rec:.4f}, kld {kl:.4f})")
        with torch.no_grad():
            sample = vae.decode(torch.randn(64, 20, device=device)).cpu()
            save_image(sample.view(64, 1, 28, 28), f"results/sample_{epoch}.png")


if __name__ == "__main__":
    main()
