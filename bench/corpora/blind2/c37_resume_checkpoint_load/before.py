import argparse
import os
import time

import timm
import torch
import torch.nn as nn
from timm.data import create_loader, create_dataset
from timm.loss import LabelSmoothingCrossEntropy


def parse_args():
    parser = argparse.ArgumentParser(description="ImageNet-1k training for ViT-H/14")
    parser.add_argument("--data-dir", default="/datasets/imagenet")
    parser.add_argument("--model", default="vit_huge_patch14_224")
    parser.add_argument("--epochs", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--output", default="output/vit_huge")
    parser.add_argument("--resume", default="", help="path to latest checkpoint")
    return parser.parse_args()


def save_checkpoint(path, model, optimizer, scaler, epoch, best_acc):
    torch.save({"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(), "best_acc": best_acc}, path)


def main():
    args = parse_args()
    device = torch.device("cuda")
    model = timm.create_model(args.model, pretrained=False, num_classes=1000, drop_path_rate=0.3).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.05)
    scaler = torch.cuda.amp.GradScaler()
    criterion = LabelSmoothingCrossEntropy(0.1)

    start_epoch, best_acc = 0, 0.0
    if args.resume and os.path.isfile(args.resume):
        checkpoint = torch.load(args.resume)
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        scaler.load_state_dict(checkpoint["scaler"])
        start_epoch, best_acc = checkpoint["epoch"] + 1, checkpoint["best_acc"]
        print(f"=> resumed from {args.resume} (epoch {checkpoint['epoch']})")

    train_set = create_dataset("", root=args.data_dir, split="train", is_training=True)
    val_set = create_dataset("", root=args.data_dir, split="validation")
    train_loader = create_loader(train_set, (3, 224, 224), args.batch_size, is_training=True,
                                 auto_augment="rand-m9-mstd0.5-inc1", num_workers=10)
    val_loader = create_loader(val_set, (3, 224, 224), 256, num_workers=10)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, args.epochs, last_epoch=start_epoch - 1)
    os.makedirs(args.output, exist_ok=True)

    for epoch in range(start_epoch, args.epochs):
        model.train()
        t0 = time.time()
        for it, (images, targets) in enumerate(train_loader):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = criterion(model(images), targets)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(optimizer)
            scaler.update()
            if it % 100 == 0:
                print(f"epoch {epoch} [{it}/{len(train_loader)}] loss {loss.item():.4f} {time.time() - t0:.0f}s")
        scheduler.step()

        model.eval()
        correct = total = 0
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            for images, targets in val_loader:
                correct += (model(images).argmax(-1) == targets).sum().item()
                total += targets.numel()
        acc = 100.0 * correct / total
        best_acc = max(best_acc, acc)
        print(f"epoch {epoch}: top-1 {acc:.2f} (best {best_acc:.2f})")
        save_checkpoint(os.path.join(args.output, "last.pth"), model, optimizer, scaler, epoch, best_acc)


if __name__ == "__main__":
    main()
