import os

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from sklearn.manifold import TSNE


class Backbone(nn.Module):
    def __init__(self, n_classes=10, emb_dim=128):
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(128, 256, 3, padding=1), nn.BatchNorm2d(256), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.classifier = nn.Linear(256, n_classes)
        self.projector = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, emb_dim))

    def forward(self, x):
        feat = self.conv(x)
        return self.classifier(feat), F.normalize(self.projector(feat), dim=1)


def plot_tsne(embeddings, labels, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = TSNE(n_components=2, init="pca", perplexity=30).fit_transform(embeddings)
    plt.figure(figsize=(8, 8))
    plt.scatter(pts[:, 0], pts[:, 1], c=labels, s=2, cmap="tab10")
    plt.savefig(path, dpi=150)
    plt.close()


def train(net, loader, epochs=50, lr=1e-3, device="cuda", tsne_every=10):
    net.to(device)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    os.makedirs("tsne", exist_ok=True)
    for epoch in range(epochs):
        net.train()
        emb_list, label_list = [], []
        correct = seen = 0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            logits, emb = net(x)
            loss = F.cross_entropy(logits, y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            emb_list.append(emb.detach())
            label_list.append(y.cpu())
            correct += (logits.argmax(1) == y).sum().item()
            seen += y.numel()
        print(f"epoch {epoch}: train acc {correct / seen:.4f}")
        if epoch % tsne_every == 0:
            embs = torch.cat(emb_list).detach().cpu().numpy()
            labs = torch.cat(label_list).numpy()
            keep = np.random.RandomState(0).choice(len(embs), size=min(5000, len(embs)), replace=False)
            plot_tsne(embs[keep], labs[keep], f"tsne/epoch_{epoch:03d}.png")
    return net
