import torch
import torch.autograd as autograd
import torch.nn as nn
from torchvision.utils import save_image


def gradient_penalty(critic, real, fake, device):
    alpha = torch.rand(real.size(0), 1, 1, 1, device=device)
    interpolates = (alpha * real + (1 - alpha) * fake).requires_grad_(True)
    d_interpolates = critic(interpolates)
    gradients = autograd.grad(
        outputs=d_interpolates,
        inputs=interpolates,
        grad_outputs=torch.ones_like(d_interpolates),
        create_graph=True,
        retain_graph=True,
        only_inputs=True,
    )[0]
    gradients = gradients.view(gradients.size(0), -1)
    return ((gradients.norm(2, dim=1) - 1) ** 2).mean()


def train_wgan_gp(generator, critic, loader, epochs=100, z_dim=128, n_critic=5, lambda_gp=10.0, device="cuda"):
    generator.to(device)
    critic.to(device)
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-4, betas=(0.0, 0.9))
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-4, betas=(0.0, 0.9))
    fixed_z = torch.randn(64, z_dim, device=device)
    step = 0
    for epoch in range(epochs):
        c_running, g_running, g_updates = 0.0, 0.0, 0
        for real, _ in loader:
            real = real.to(device)
            z = torch.randn(real.size(0), z_dim, device=device)
            fake = generator(z).detach()

            opt_c.zero_grad()
            gp = gradient_penalty(critic, real, fake, device)
            c_loss = critic(fake).mean() - critic(real).mean() + lambda_gp * gp
            c_loss.backward()
            opt_c.step()
            c_running += c_loss.item()

            if step % n_critic == 0:
                opt_g.zero_grad()
                g_loss = -critic(generator(torch.randn(real.size(0), z_dim, device=device))).mean()
                g_loss.backward()
                opt_g.step()
                g_running += g_loss.item()
                g_updates += 1
            step += 1

        print(f"epoch {epoch}: critic {c_running / len(loader):.4f} gen {g_running / max(g_updates, 1):.4f}")
        generator.eval()
        with torch.no_grad():
            samples = generator(fixed_z)
        save_image(samples, f"samples/epoch_{epoch:03d}.png", nrow=8, normalize=True)
        generator.train()
        torch.save({"g": generator.state_dict(), "c": critic.state_dict()}, "wgan_gp.pt")


class Critic(nn.Module):
    def __init__(self, ch=64):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(3, ch, 4, 2, 1), nn.LeakyReLU(0.2),
            nn.Conv2d(ch, ch * 2, 4, 2, 1), nn.InstanceNorm2d(ch * 2, affine=True), nn.LeakyReLU(0.2),
            nn.Conv2d(ch * 2, ch * 4, 4, 2, 1), nn.InstanceNorm2d(ch * 4, affine=True), nn.LeakyReLU(0.2),
            nn.Conv2d(ch * 4, 1, 4, 1, 0),
        )

    def forward(self, x):
        return self.net(x).view(-1)
