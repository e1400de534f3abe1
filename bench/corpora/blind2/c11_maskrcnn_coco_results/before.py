import argparse
import json

import numpy as np
import pycocotools.mask as mask_util
import torch
import torchvision
from pycocotools.coco import COCO
from pycocotools.cocoeval import COCOeval
from torch.utils.data import DataLoader
from torchvision.datasets import CocoDetection
from torchvision.transforms import functional as TF


class CocoVal(CocoDetection):
    def __getitem__(self, idx):
        img, _ = super().__getitem__(idx)
        return TF.to_tensor(img), self.ids[idx]


def collate(batch):
    return tuple(zip(*batch))


@torch.no_grad()
def run_inference(model, loader, device):
    model.eval()
    predictions = {}
    for it, (images, image_ids) in enumerate(loader):
        images = [img.to(device, non_blocking=True) for img in images]
        outputs = model(images)
        for image_id, output in zip(image_ids, outputs):
            predictions[image_id] = output
        if it % 100 == 0:
            print(f"[{it}/{len(loader)}] images done: {len(predictions)}")
    return predictions


def to_coco_results(predictions, label_to_cat, score_thr=0.05):
    results = []
    for image_id, pred in predictions.items():
        keep = pred["scores"] > score_thr
        boxes = pred["boxes"][keep].cpu()
        boxes[:, 2:] -= boxes[:, :2]
        masks = (pred["masks"][keep, 0] > 0.5).cpu().numpy()
        for box, score, label, m in zip(boxes.tolist(), pred["scores"][keep].tolist(),
                                        pred["labels"][keep].tolist(), masks):
            rle = mask_util.encode(np.asfortranarray(m.astype(np.uint8)))
            rle["counts"] = rle["counts"].decode("ascii")
            results.append({"image_id": image_id, "category_id": label_to_cat[label],
                            "bbox": box, "score": score, "segmentation": rle})
    return results


def main():
    parser = argparse.ArgumentParser(description="COCO val2017 bbox/segm evaluation for Mask R-CNN")
    parser.add_argument("--coco", default="/datasets/coco")
    parser.add_argument("--weights", default="checkpoints/maskrcnn_r50_fpn_v2.pth")
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--out", default="segm_results.json")
    args = parser.parse_args()

    device = torch.device("cuda")
    model = torchvision.models.detection.maskrcnn_resnet50_fpn_v2(num_classes=91, box_detections_per_img=100)
    model.load_state_dict(torch.load(args.weights, map_location="cpu"))
    model.to(device)

    ann_file = f"{args.coco}/annotations/instances_val2017.json"
    dataset = CocoVal(f"{args.coco}/val2017", ann_file)
    loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=4, collate_fn=collate)
    predictions = run_inference(model, loader, device)

    label_to_cat = {i: i for i in range(91)}
    results = to_coco_results(predictions, label_to_cat)
    with open(args.out, "w") as f:
        json.dump(results, f)
    coco_gt = COCO(ann_file)
    for iou_type in ("bbox", "segm"):
        ev = COCOeval(coco_gt, coco_gt.loadRes(args.out), iou_type)
        ev.evaluate()
        ev.accumulate()
        ev.summarize()


if __name__ == "__main__":
    main()
