import argparse
import math

import torch
import torchvision
from torch.utils.data import DataLoader
from torchmetrics.detection import MeanAveragePrecision
from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2
from torchvision.transforms import v2 as T


def get_loader(root, split, train, batch_size):
    tfs = [T.ToImage(), T.ToDtype(torch.float32, scale=True)]
    if train:
        tfs.insert(0, T.RandomHorizontalFlip())
    ds = CocoDetection(f"{root}/{split}2017", f"{root}/annotations/instances_{split}2017.json",
                       transforms=T.Compose(tfs))
    ds = wrap_dataset_for_transforms_v2(ds, target_keys=["boxes", "labels", "masks", "image_id"])
    return DataLoader(ds, batch_size=batch_size, shuffle=train, num_workers=8,
                      collate_fn=lambda b: tuple(zip(*b)))


def train_one_epoch(model, optimizer, loader, device, epoch, warmup_iters=1000):
    model.train()
    for it, (images, targets) in enumerate(loader):
        images = [img.to(device) for img in images]
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        loss_dict = model(images, targets)
        loss = sum(loss_dict.values())
        if epoch == 0 and it < warmup_iters:
            for g in optimizer.param_groups:
                g["lr"] = g["initial_lr"] * (it + 1) / warmup_iters
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if it % 200 == 0:
            print(f"epoch {epoch} iter {it}/{len(loader)} " + " ".join(f"{k}={v.item():.3f}" for k, v in loss_dict.items()))


@torch.no_grad()
def validate(model, loader, metric, device):
    model.eval()
    for images, targets in loader:
        outputs = model([img.to(device) for img in images])
        preds = [{"boxes": o["boxes"], "scores": o["scores"], "labels": o["labels"],
                  "masks": (o["masks"][:, 0] > 0.5)} for o in outputs]
        gts = [{"boxes": t["boxes"].to(device), "labels": t["labels"].to(device),
                "masks": t["masks"].bool().to(device)} for t in targets]
        metric.update(preds, gts)
    return metric.compute()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--coco", default="/datasets/coco")
    parser.add_argument("--epochs", type=int, default=26)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.02)
    args = parser.parse_args()

    device = torch.device("cuda")
    model = torchvision.models.detection.maskrcnn_resnet50_fpn(weights_backbone="IMAGENET1K_V1", num_classes=91)
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=args.lr, momentum=0.9, weight_decay=1e-4)
    for g in optimizer.param_groups:
        g["initial_lr"] = g["lr"]
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[16, 22], gamma=0.1)
    train_loader = get_loader(args.coco, "train", True, args.batch_size)
    val_loader = get_loader(args.coco, "val", False, 2)
    val_map = MeanAveragePrecision(iou_type="segm").to(device)

    best = -math.inf
    for epoch in range(args.epochs):
        train_one_epoch(model, optimizer, train_loader, device, epoch)
        scheduler.step()
        stats = validate(model, val_loader, val_map, device)
        val_map.reset()
        print(f"epoch {epoch}: segm mAP {stats['map'].item():.4f} mAP50 {stats['map_50'].item():.4f}")
        if stats["map"].item() > best:
            best = stats["map"].item()
            torch.save(model.state_dict(), "checkpoints/maskrcnn_best.pth")


if __name__ == "__main__":
    main()
