import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torchvision.utils import save_image


def cosine_beta_schedule(timesteps, s=0.008):
    steps = timesteps + 1
    x = torch.linspace(0, timesteps, steps, dtype=torch.float64)
    alphas_cumprod = torch.cos(((x / timesteps) + s) / (1 + s) * math.pi * 0.5) ** 2
    alphas_cumprod = alphas_cumprod / alphas_cumprod[0]
    betas = 1 - (alphas_cumprod[1:] / alphas_cumprod[:-1])
    return torch.clip(betas, 0, 0.999)


def extract(a, t, x_shape):
    out = a.gather(-1, t)
    return out.reshape(t.shape[0], *((1,) * (len(x_shape) - 1)))


class GaussianDiffusion(nn.Module):
    def __init__(self, denoiser, image_size, channels=3, timesteps=1000):
        super().__init__()
        self.denoiser = denoiser
        self.image_size = image_size
        self.channels = channels
        self.num_timesteps = timesteps
        betas = cosine_beta_schedule(timesteps)
        alphas = 1.0 - betas
        alphas_cumprod = torch.cumprod(alphas, dim=0)
        alphas_cumprod_prev = F.pad(alphas_cumprod[:-1], (1, 0), value=1.0)
        reg = lambda name, val: self.register_buffer(name, val.to(torch.float32))
        reg("betas", betas)
        reg("sqrt_alphas_cumprod", torch.sqrt(alphas_cumprod))
        reg("sqrt_one_minus_alphas_cumprod", torch.sqrt(1.0 - alphas_cumprod))
        reg("sqrt_recip_alphas", torch.sqrt(1.0 / alphas))
        reg("posterior_variance", betas * (1.0 - alphas_cumprod_prev) / (1.0 - alphas_cumprod))

    def q_sample(self, x_start, t, noise):
        return (extract(self.sqrt_alphas_cumprod, t, x_start.shape) * x_start
                + extract(self.sqrt_one_minus_alphas_cumprod, t, x_start.shape) * noise)

    def p_losses(self, x_start, t):
        noise = torch.randn_like(x_start)
        x_noisy = self.q_sample(x_start, t, noise)
        return F.mse_loss(self.denoiser(x_noisy, t), noise)

    def forward(self, img):
        t = torch.randint(0, self.num_timesteps, (img.shape[0],), device=img.device).long()
        return self.p_losses(img * 2 - 1, t)

    def p_sample(self, x, t, t_index):
        betas_t = extract(self.betas, t, x.shape)
        sqrt_one_minus_t = extract(self.sqrt_one_minus_alphas_cumprod, t, x.shape)
        sqrt_recip_alphas_t = extract(self.sqrt_recip_alphas, t, x.shape)
        eps = self.denoiser(x, t)
        model_mean = sqrt_recip_alphas_t * (x - betas_t * eps / sqrt_one_minus_t)
        if t_index == 0:
            return model_mean
        noise = torch.randn_like(x)
        return model_mean + torch.sqrt(extract(self.posterior_variance, t, x.shape)) * noise

    def sample(self, batch_size=16):
        device = self.betas.device
        img = torch.randn(batch_size, self.channels, self.image_size, self.image_size, device=device)
        for i in reversed(range(self.num_timesteps)):
            t = torch.full((batch_size,), i, device=device, dtype=torch.long)
            img = self.p_sample(img, t, i)
        return (img.clamp(-1, 1) + 1) / 2


def train(diffusion, loader, optimizer, epochs, device, sample_every=1000):
    step = 0
    for epoch in range(epochs):
        for images, _ in loader:
            diffusion.train()
            loss = diffusion(images.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            step += 1
            if step % sample_every == 0:
                diffusion.eval()
                samples = diffusion.sample(batch_size=16)
                save_image(samples, f"results/sample-{step}.png", nrow=4)
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
