import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F

from vit import VisionTransformer


def attention_rollout(attn_layers):
    """attn_layers: list of (B, heads, N, N) tensors from one forward pass."""
    result = None
    for attn in attn_layers:
        a = attn.mean(dim=1)
        a = a + torch.eye(a.size(-1), device=a.device)
        a = a / a.sum(dim=-1, keepdim=True)
        result = a if result is None else a @ result
    return result[:, 0, 1:]


def save_rollouts(rollouts, images, epoch, out_dir="attn_vis", grid=14):
    os.makedirs(out_dir, exist_ok=True)
    fig, axes = plt.subplots(2, len(rollouts), figsize=(3 * len(rollouts), 6))
    for j, (r, img) in enumerate(zip(rollouts, images)):
        axes[0, j].imshow(img.permute(1, 2, 0).clamp(0, 1).numpy())
        axes[1, j].imshow(r[0].reshape(grid, grid).detach().cpu().numpy(), cmap="inferno")
        axes[0, j].axis("off")
        axes[1, j].axis("off")
    fig.savefig(f"{out_dir}/epoch_{epoch:03d}.png")
    plt.close(fig)


def train(vit, loader, epochs, device, vis_every=200):
    optimizer = torch.optim.AdamW(vit.parameters(), lr=3e-4, weight_decay=0.05)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs * len(loader))
    criterion = nn.CrossEntropyLoss(label_smoothing=0.1)
    for epoch in range(epochs):
        vit.train()
        rollouts, vis_images = [], []
        for step, (images, labels) in enumerate(loader):
            images, labels = images.to(device), labels.to(device)
            logits, attn_layers = vit(images, return_attention=True)
            loss = criterion(logits, labels)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(vit.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            if step % vis_every == 0:
                rollouts.append(attention_rollout(attn_layers).detach())
                vis_images.append(images[0].cpu() * 0.5 + 0.5)
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
        save_rollouts(rollouts, vis_images, epoch)


if __name__ == "__main__":
    from data import get_imagenette_loader

    dev = torch.device("cuda")
    net = VisionTransformer(img_size=224, patch_size=16, embed_dim=384, depth=12, num_heads=6,
                            num_classes=10).to(dev)
    train(net, get_imagenette_loader(batch_size=128), epochs=100, device=dev)
