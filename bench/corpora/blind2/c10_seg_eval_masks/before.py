import argparse

import numpy as np
import torch
import torch.nn.functional as F
import torchvision.transforms.functional as TF
from torch.utils.data import DataLoader
from torchvision.datasets import Cityscapes
from torchvision.models.segmentation import deeplabv3_resnet101

CLASS_NAMES = [
    "road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign",
    "vegetation", "terrain", "sky", "person", "rider", "car", "truck", "bus", "train",
    "motorcycle", "bicycle",
]
ID_TO_TRAIN = np.full(256, 255, dtype=np.int64)
for train_id, cid in enumerate([7, 8, 11, 12, 13, 17, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 31, 32, 33]):
    ID_TO_TRAIN[cid] = train_id


def joint_transform(image, target):
    image = TF.normalize(TF.to_tensor(image), [0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    target = torch.from_numpy(ID_TO_TRAIN[np.array(target)])
    return image, target


def confusion_matrix(pred, gt, n):
    valid = gt != 255
    idx = n * gt[valid] + pred[valid]
    return torch.bincount(idx, minlength=n * n).reshape(n, n)


@torch.no_grad()
def evaluate(model, loader, device, num_classes):
    model.eval()
    pred_masks, gt_masks = [], []
    for i, (image, target) in enumerate(loader):
        logits = model(image.to(device, non_blocking=True))["out"]
        logits = F.interpolate(logits, size=target.shape[-2:], mode="bilinear", align_corners=False)
        pred_masks.append(logits.argmax(1))
        gt_masks.append(target)
        if i % 50 == 0:
            print(f"eval {i}/{len(loader)}")
    preds = torch.cat(pred_masks).cpu()
    gts = torch.cat(gt_masks)
    cm = confusion_matrix(preds.flatten(), gts.flatten(), num_classes).double()
    iou = cm.diag() / (cm.sum(0) + cm.sum(1) - cm.diag()).clamp(min=1)
    return iou


def main():
    parser = argparse.ArgumentParser(description="Cityscapes val mIoU for DeepLabV3")
    parser.add_argument("--root", default="/datasets/cityscapes")
    parser.add_argument("--checkpoint", default="checkpoints/deeplabv3_r101_cityscapes.pth")
    parser.add_argument("--batch_size", type=int, default=2)
    args = parser.parse_args()

    device = torch.device("cuda")
    model = deeplabv3_resnet101(num_classes=len(CLASS_NAMES), aux_loss=True)
    model.load_state_dict(torch.load(args.checkpoint, map_location="cpu")["model"])
    model.to(device)

    val_set = Cityscapes(args.root, split="val", mode="fine", target_type="semantic", transforms=joint_transform)
    loader = DataLoader(val_set, batch_size=args.batch_size, shuffle=False, num_workers=4, pin_memory=True)
    iou = evaluate(model, loader, device, len(CLASS_NAMES))
    for name, v in zip(CLASS_NAMES, iou.tolist()):
        print(f"{name:>15s}: {100 * v:.2f}")
    print(f"mIoU: {100 * iou.mean().item():.2f}")


if __name__ == "__main__":
    main()
