import math
import sys
import time
from collections import defaultdict

import torch
import torchvision
from torchvision.models.detection.faster_rcnn import FastRCNNPredictor

from datasets import PennFudanDataset, collate_fn, get_transform


def get_model(num_classes):
    model = torchvision.models.detection.fasterrcnn_resnet50_fpn(weights="DEFAULT")
    in_features = model.roi_heads.box_predictor.cls_score.in_features
    model.roi_heads.box_predictor = FastRCNNPredictor(in_features, num_classes)
    return model


def train_one_epoch(model, optimizer, data_loader, device, epoch, print_freq=20):
    model.train()
    meters = defaultdict(float)
    start = time.time()
    for it, (images, targets) in enumerate(data_loader):
        images = [img.to(device) for img in images]
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]

        loss_dict = model(images, targets)
        losses = sum(loss for loss in loss_dict.values())
        loss_value = losses.item()
        if not math.isfinite(loss_value):
            print(f"Loss is {loss_value}, stopping training")
            print(loss_dict)
            sys.exit(1)

        optimizer.zero_grad()
        losses.backward()
        optimizer.step()

        for name, value in loss_dict.items():
            meters[name] += value.item()
        meters["loss"] += loss_value

        if it % print_freq == 0:
            avg = {k: float(v) / (it + 1) for k, v in meters.items()}
            lr = optimizer.param_groups[0]["lr"]
            print(f"Epoch [{epoch}] [{it}/{len(data_loader)}] lr {lr:.5f} "
                  + " ".join(f"{k}: {v:.4f}" for k, v in avg.items()))
    print(f"epoch {epoch} took {time.time() - start:.1f}s")
    return {k: float(v) / len(data_loader) for k, v in meters.items()}


def main():
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    dataset = PennFudanDataset("data/PennFudanPed", get_transform(train=True))
    data_loader = torch.utils.data.DataLoader(dataset, batch_size=2, shuffle=True,
                                              num_workers=4, collate_fn=collate_fn)
    model = get_model(num_classes=2).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.005, momentum=0.9, weight_decay=0.0005)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.1)

    for epoch in range(10):
        stats = train_one_epoch(model, optimizer, data_loader, device, epoch)
        lr_scheduler.step()
        print(f"epoch {epoch} summary:", stats)
        torch.save(model.state_dict(), f"fasterrcnn_epoch{epoch}.pth")


if __name__ == "__main__":
    main()
