import argparse
import json

import numpy as np
import torch
import torch.nn.functional as F
import torchvision
from sklearn.metrics import classification_report, confusion_matrix
from torch.utils.data import DataLoader
from torchvision import transforms


def build_val_loader(root, batch_size):
    tf = transforms.Compose([
        transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(),
        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    ])
    ds = torchvision.datasets.ImageFolder(root, transform=tf)
    return DataLoader(ds, batch_size=batch_size, shuffle=False, num_workers=8, pin_memory=True), ds.classes


def predict(model, loader, device):
    model.eval()
    all_probs, all_targets = [], []
    with torch.no_grad():
        for images, targets in loader:
            logits = model(images.to(device, non_blocking=True))
            all_probs.append(F.softmax(logits, dim=1).detach().cpu())
            all_targets.append(targets)
    return torch.cat(all_probs), torch.cat(all_targets)


def main():
    parser = argparse.ArgumentParser(description="Per-class report for a fine-tuned EfficientNet")
    parser.add_argument("--val_dir", default="/datasets/plantvillage/val")
    parser.add_argument("--weights", default="checkpoints/effnet_b3_plantvillage.pt")
    parser.add_argument("--batch_size", type=int, default=128)
    parser.add_argument("--report", default="report.json")
    args = parser.parse_args()

    device = torch.device("cuda")
    loader, classes = build_val_loader(args.val_dir, args.batch_size)
    model = torchvision.models.efficientnet_b3(num_classes=len(classes))
    model.load_state_dict(torch.load(args.weights, map_location="cpu"))
    model.to(device)

    probs, targets = predict(model, loader, device)
    preds = probs.argmax(1).numpy()
    y = targets.numpy()
    report = classification_report(y, preds, target_names=classes, output_dict=True)
    cm = confusion_matrix(y, preds)
    top5 = (probs.topk(5, dim=1).indices == targets[:, None]).any(1).float().mean().item()
    print(f"top-1 {report['accuracy']:.4f}  top-5 {top5:.4f}")
    worst = np.argsort(np.diag(cm) / cm.sum(1))[:5]
    print("hardest classes:", [classes[i] for i in worst])
    with open(args.report, "w") as f:
        json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
