import argparse
import os

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import datasets, models, transforms


def get_loaders(root, batch_size, workers=4):
    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    train_tf = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        normalize,
    ])
    val_tf = transforms.Compose([
        transforms.Resize(256),
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        normalize,
    ])
    train_set = datasets.ImageFolder(os.path.join(root, "train"), train_tf)
    val_set = datasets.ImageFolder(os.path.join(root, "val"), val_tf)
    train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True,
                              num_workers=workers, pin_memory=True)
    val_loader = DataLoader(val_set, batch_size=batch_size, shuffle=False,
                            num_workers=workers, pin_memory=True)
    return train_loader, val_loader, len(train_set.classes)


def train_one_epoch(model, loader, optimizer, device, epoch):
    model.train()
    running = 0.0
    for i, (images, targets) in enumerate(loader):
        images = images.to(device, non_blocking=True)
        targets = targets.to(device, non_blocking=True)
        output = model(images)
        loss = F.cross_entropy(output, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        running += loss.item()
        if i % 50 == 0:
            print(f"epoch {epoch} [{i}/{len(loader)}] loss {running / (i + 1):.4f}")
    return running / len(loader)


def evaluate(model, loader, device):
    model.eval()
    correct = 0
    total = 0
    val_loss = 0.0
    for images, targets in loader:
        images, targets = images.to(device), targets.to(device)
        output = model(images)
        val_loss += F.cross_entropy(output, targets, reduction="sum").item()
        correct += (output.argmax(dim=1) == targets).sum().item()
        total += targets.size(0)
    return val_loss / total, correct / total


def main():
    parser = argparse.ArgumentParser(description="ResNet fine-tuning")
    parser.add_argument("data", help="path to dataset")
    parser.add_argument("--arch", default="resnet50")
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--out", default="checkpoints")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_loader, val_loader, num_classes = get_loaders(args.data, args.batch_size)
    model = models.__dict__[args.arch](num_classes=num_classes).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=args.epochs)

    os.makedirs(args.out, exist_ok=True)
    best_acc = 0.0
    for epoch in range(args.epochs):
        train_loss = train_one_epoch(model, train_loader, optimizer, device, epoch)
        val_loss, val_acc = evaluate(model, val_loader, device)
        scheduler.step()
        print(f"epoch {epoch}: train {train_loss:.4f} val {val_loss:.4f} acc {val_acc:.4f}")
        if val_acc > best_acc:
            best_acc = val_acc
            torch.save({"epoch": epoch, "state_dict": model.state_dict(), "acc": val_acc},
                       os.path.join(args.out, "best.pth"))


if __name__ == "__main__":
    main()
