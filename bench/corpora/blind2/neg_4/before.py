import math

import torch
import torch.nn as nn
import torchvision


class AnchorGenerator(nn.Module):
    """Anchors for a 3-level FPN head (strides 8, 16, 32)."""

    def __init__(self, sizes=(32, 64, 128), strides=(8, 16, 32), ratios=(0.5, 1.0, 2.0)):
        super().__init__()
        self.sizes, self.strides, self.ratios = sizes, strides, ratios

    def cell_anchors(self, size, device):
        ratios = torch.tensor(self.ratios, device=device)
        scales = torch.tensor([size, size * 2 ** (1 / 3), size * 2 ** (2 / 3)], device=device)
        h = (scales[None, :] * ratios[:, None].sqrt()).flatten()
        w = (scales[None, :] / ratios[:, None].sqrt()).flatten()
        return torch.stack([-w, -h, w, h], dim=1) / 2

    def forward(self, feature_shapes, device):
        anchors = torch.zeros(0, 4, device=device)
        for (fh, fw), size, stride in zip(feature_shapes, self.sizes, self.strides):
            shifts_x = (torch.arange(fw, device=device) + 0.5) * stride
            shifts_y = (torch.arange(fh, device=device) + 0.5) * stride
            sy, sx = torch.meshgrid(shifts_y, shifts_x, indexing="ij")
            shifts = torch.stack([sx, sy, sx, sy], dim=-1).reshape(-1, 1, 4)
            level = (shifts + self.cell_anchors(size, device)[None]).reshape(-1, 4)
            anchors = torch.cat([anchors, level], dim=0)
        return anchors


class RetinaHead(nn.Module):
    def __init__(self, in_ch=256, num_anchors=9, num_classes=80):
        super().__init__()
        def tower():
            return nn.Sequential(*[m for _ in range(4) for m in (nn.Conv2d(in_ch, in_ch, 3, padding=1), nn.ReLU())])
        self.cls_tower, self.box_tower = tower(), tower()
        self.cls = nn.Conv2d(in_ch, num_anchors * num_classes, 3, padding=1)
        self.box = nn.Conv2d(in_ch, num_anchors * 4, 3, padding=1)
        nn.init.constant_(self.cls.bias, -math.log(99))
        self.num_classes = num_classes

    def forward(self, feats):
        cls_out, box_out = [], []
        for f in feats:
            b = f.size(0)
            cls_out.append(self.cls(self.cls_tower(f)).permute(0, 2, 3, 1).reshape(b, -1, self.num_classes))
            box_out.append(self.box(self.box_tower(f)).permute(0, 2, 3, 1).reshape(b, -1, 4))
        return torch.cat(cls_out, dim=1), torch.cat(box_out, dim=1)


class TinyRetinaNet(nn.Module):
    def __init__(self, num_classes=80):
        super().__init__()
        backbone = torchvision.models.resnet50(weights="IMAGENET1K_V2")
        self.body = torchvision.models._utils.IntermediateLayerGetter(
            backbone, {"layer2": "p3", "layer3": "p4", "layer4": "p5"})
        self.fpn = torchvision.ops.FeaturePyramidNetwork([512, 1024, 2048], 256)
        self.head = RetinaHead(num_classes=num_classes)
        self.anchor_gen = AnchorGenerator()

    def forward(self, images):
        feats = list(self.fpn(self.body(images)).values())
        cls_logits, box_deltas = self.head(feats)
        anchors = self.anchor_gen([f.shape[-2:] for f in feats], images.device)
        return cls_logits, box_deltas, anchors


if __name__ == "__main__":
    model = TinyRetinaNet().cuda().eval()
    with torch.no_grad():
        cls_logits, box_deltas, anchors = model(torch.randn(2, 3, 640, 640, device="cuda"))
    print(cls_logits.shape, box_deltas.shape, anchors.shape)
