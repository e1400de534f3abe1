import argparse
import logging

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision.datasets import VOCSegmentation
from torchvision.models.segmentation import fcn_resnet50
import torchvision.transforms.v2 as T

logger = logging.getLogger("seg")


class ConfusionMeter:
    """Accumulates a fixed num_classes x num_classes confusion matrix on the GPU."""

    def __init__(self, num_classes, device, ignore_index=255):
        self.n, self.ignore = num_classes, ignore_index
        self.mat = torch.zeros(num_classes, num_classes, dtype=torch.long, device=device)

    @torch.no_grad()
    def update(self, logits, target):
        pred = logits.argmax(1).flatten()
        target = target.flatten()
        keep = target != self.ignore
        self.mat += torch.bincount(self.n * target[keep] + pred[keep], minlength=self.n ** 2).view(self.n, self.n)

    def compute(self):
        m = self.mat.double()
        iou = m.diag() / (m.sum(0) + m.sum(1) - m.diag()).clamp(min=1)
        return {"pixel_acc": (m.diag().sum() / m.sum()).item(), "miou": iou.mean().item()}

    def reset(self):
        self.mat.zero_()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", default="/datasets/voc")
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--batch_size", type=int, default=16)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    tf = T.Compose([T.ToImage(), T.RandomResizedCrop(480, scale=(0.5, 2.0), antialias=True),
                    T.RandomHorizontalFlip(), T.ToDtype(torch.float32, scale=True),
                    T.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])])
    train = VOCSegmentation(args.root, year="2012", image_set="train", transforms=lambda i, t: tf(i, t))
    loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, num_workers=8, drop_last=True)

    device = torch.device("cuda")
    model = fcn_resnet50(weights_backbone="IMAGENET1K_V2", num_classes=21).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    meter = ConfusionMeter(21, device)
    for epoch in range(args.epochs):
        model.train()
        for step, (img, mask) in enumerate(loader):
            img, mask = img.to(device), mask.to(device).squeeze(1).long()
            logits = model(img)["out"]
            loss = F.cross_entropy(logits, mask, ignore_index=255)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            meter.update(logits.detach(), mask)
        stats = meter.compute()
        logger.info("epoch %d loss %.4f train pixAcc %.4f mIoU %.4f", epoch, loss.item(), stats["pixel_acc"], stats["miou"])
        meter.reset()


if __name__ == "__main__":
    main()
