"""k-NN evaluation of a self-supervised ResNet-50 backbone on ImageNet."""
import argparse
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torchvision import transforms
from tqdm import tqdm

logger = logging.getLogger("knn")


def build_loader(root, batch_size, workers):
    tf = transforms.Compose([
        transforms.Resize(256, interpolation=transforms.InterpolationMode.BICUBIC),
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ])
    ds = torchvision.datasets.ImageFolder(root, transform=tf)
    return torch.utils.data.DataLoader(ds, batch_size=batch_size, shuffle=False,
                                       num_workers=workers, pin_memory=True)


@torch.no_grad()
def extract_features(model, loader, device):
    model.eval()
    feats, labels = [], []
    for images, targets in tqdm(loader, desc="extract"):
        images = images.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.float16):
            f = model(images)
        feats.append(F.normalize(f.float(), dim=1).cpu())
        labels.append(targets)
    return torch.cat(feats), torch.cat(labels)


@torch.no_grad()
def knn_classify(train_feats, train_labels, test_feats, test_labels, k=20, T=0.07, num_classes=1000):
    correct, total = 0, 0
    bank = train_feats.t()
    for chunk, y in zip(test_feats.split(256), test_labels.split(256)):
        sims = chunk @ bank
        topk_sims, idx = sims.topk(k, dim=1)
        neighbours = train_labels[idx]
        weights = (topk_sims / T).exp()
        votes = torch.zeros(chunk.size(0), num_classes).scatter_add_(1, neighbours, weights)
        correct += (votes.argmax(1) == y).sum().item()
        total += y.numel()
    return 100.0 * correct / total


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/datasets/imagenet")
    parser.add_argument("--weights", required=True)
    parser.add_argument("--batch_size", type=int, default=512)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--k", type=int, default=20)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    device = torch.device("cuda")
    model = torchvision.models.resnet50()
    model.fc = nn.Identity()
    state = torch.load(args.weights, map_location="cpu")
    msg = model.load_state_dict({k.replace("backbone.", ""): v for k, v in state.items()}, strict=False)
    logger.info("loaded backbone: %s", msg)
    model.to(device)

    train_feats, train_labels = extract_features(model, build_loader(f"{args.data}/train", args.batch_size, args.workers), device)
    val_feats, val_labels = extract_features(model, build_loader(f"{args.data}/val", args.batch_size, args.workers), device)
    train_feats, val_feats = train_feats.cpu(), val_feats.cpu()
    acc = knn_classify(train_feats, train_labels, val_feats, val_labels, k=args.k)
    logger.info("k-NN (k=%d) top-1: %.2f", args.k, acc)


if __name__ == "__main__":
    main()
