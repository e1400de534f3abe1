"""Compute an FID-style score between a folder of real and a folder of generated images."""
import argparse

import numpy as np
import torch
import torch.nn as nn
from scipy import linalg
from torch.utils.data import DataLoader
from torchvision import datasets, models, transforms


def build_extractor(device):
    net = models.inception_v3(weights=models.Inception_V3_Weights.IMAGENET1K_V1,
                              aux_logits=True, transform_input=False)
    net.fc = nn.Identity()
    return net.to(device)


def make_loader(folder, batch_size):
    tf = transforms.Compose([
        transforms.Resize((299, 299)),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    ds = datasets.ImageFolder(folder, transform=tf)
    return DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=8)


def extract_features(extractor, loader, device):
    feats = []
    with torch.inference_mode():
        for images, _ in loader:
            images = images.to(device)
            f = extractor(images)
            feats.append(f.detach().cpu().numpy())
    return np.concatenate(feats, axis=0)


def stats(features):
    return features.mean(axis=0), np.cov(features, rowvar=False)


def frechet_distance(mu1, sigma1, mu2, sigma2, eps=1e-6):
    diff = mu1 - mu2
    covmean, _ = linalg.sqrtm(sigma1.dot(sigma2), disp=False)
    if not np.isfinite(covmean).all():
        offset = np.eye(sigma1.shape[0]) * eps
        covmean = linalg.sqrtm((sigma1 + offset).dot(sigma2 + offset))
    if np.iscomplexobj(covmean):
        covmean = covmean.real
    return float(diff.dot(diff) + np.trace(sigma1) + np.trace(sigma2) - 2 * np.trace(covmean))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("real")
    parser.add_argument("fake")
    parser.add_argument("--batch-size", type=int, default=64)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    extractor = build_extractor(device)
    extractor.eval()

    real_feats = extract_features(extractor, make_loader(args.real, args.batch_size), device)
    fake_feats = extract_features(extractor, make_loader(args.fake, args.batch_size), device)
    mu_r, sig_r = stats(real_feats)
    mu_f, sig_f = stats(fake_feats)
    print(f"FID: {frechet_distance(mu_r, sig_r, mu_f, sig_f):.3f}")


if __name__ == "__main__":
    main()
