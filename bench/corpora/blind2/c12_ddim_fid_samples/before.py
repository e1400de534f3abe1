"""Generate samples with a DDIM sampler and dump them for FID computation."""
import argparse
import math
import os

import numpy as np
import torch
from diffusers import DDIMScheduler, UNet2DModel
from tqdm import tqdm


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_dir", default="runs/ddpm-lsun-church-256/unet")
    parser.add_argument("--num_samples", type=int, default=50_000)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--eta", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="samples/church_ddim100.npz")
    return parser.parse_args()


def sample_batch(unet, scheduler, batch_size, generator, eta, device):
    shape = (batch_size, unet.config.in_channels, unet.config.sample_size, unet.config.sample_size)
    x = torch.randn(shape, generator=generator, device=device)
    for t in scheduler.timesteps:
        with torch.autocast("cuda", dtype=torch.float16):
            eps = unet(x, t).sample
        x = scheduler.step(eps.float(), t, x, eta=eta, generator=generator).prev_sample
    return x


def main():
    args = parse_args()
    device = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = True

    unet = UNet2DModel.from_pretrained(args.model_dir).to(device).eval()
    unet.requires_grad_(False)
    scheduler = DDIMScheduler(num_train_timesteps=1000, beta_schedule="linear", clip_sample=True)
    scheduler.set_timesteps(args.steps)
    generator = torch.Generator(device=device).manual_seed(args.seed)

    samples = []
    n_batches = math.ceil(args.num_samples / args.batch_size)
    for _ in tqdm(range(n_batches), desc="sampling"):
        x = sample_batch(unet, scheduler, args.batch_size, generator, args.eta, device)
        x = (x.clamp(-1, 1) + 1) / 2
        samples.append(x.detach())

    images = torch.cat(samples)[: args.num_samples]
    images = (images * 255).round().to(torch.uint8).permute(0, 2, 3, 1).cpu().numpy()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    np.savez(args.out, arr_0=images)
    print(f"wrote {images.shape[0]} samples of shape {images.shape[1:]} to {args.out}")


if __name__ == "__main__":
    main()
