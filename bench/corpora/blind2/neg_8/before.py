import argparse
import time

import torch
import torch.nn as nn
import torchvision
from torch.utils.data import DataLoader
from torchvision import transforms


def evaluate(model, loader, criterion, device):
    model.eval()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    seen = 0
    with torch.no_grad():
        for images, targets in loader:
            images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            logits = model(images)
            loss_sum += criterion(logits, targets) * targets.size(0)
            correct += (logits.argmax(1) == targets).sum()
            seen += targets.size(0)
    return loss_sum.item() / seen, correct.item() / seen


def train_one_epoch(model, loader, criterion, optimizer, scaler, device, epoch):
    model.train()
    running = torch.zeros((), device=device)
    t0 = time.time()
    for step, (images, targets) in enumerate(loader):
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = criterion(model(images), targets)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        running += loss.detach()
        if (step + 1) % 100 == 0:
            print(f"epoch {epoch} step {step + 1} loss {running.item() / 100:.4f} ({time.time() - t0:.1f}s)")
            running.zero_()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/datasets/places365")
    parser.add_argument("--epochs", type=int, default=90)
    parser.add_argument("--batch_size", type=int, default=256)
    args = parser.parse_args()

    device = torch.device("cuda")
    norm = transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    train_tf = transforms.Compose([transforms.RandomResizedCrop(224), transforms.RandomHorizontalFlip(),
                                   transforms.ToTensor(), norm])
    val_tf = transforms.Compose([transforms.Resize(256), transforms.CenterCrop(224), transforms.ToTensor(), norm])
    train_set = torchvision.datasets.Places365(args.data, split="train-standard", small=True, transform=train_tf)
    val_set = torchvision.datasets.Places365(args.data, split="val", small=True, transform=val_tf)
    train_loader = DataLoader(train_set, args.batch_size, shuffle=True, num_workers=16, pin_memory=True, drop_last=True)
    val_loader = DataLoader(val_set, args.batch_size, num_workers=16, pin_memory=True)

    model = torchvision.models.resnet50(num_classes=365).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4, nesterov=True)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.epochs)
    scaler = torch.cuda.amp.GradScaler()
    for epoch in range(args.epochs):
        train_one_epoch(model, train_loader, criterion, optimizer, scaler, device, epoch)
        scheduler.step()
        val_loss, val_acc = evaluate(model, val_loader, criterion, device)
        print(f"epoch {epoch}: val loss {val_loss:.4f} acc {100 * val_acc:.2f}")


if __name__ == "__main__":
    main()
