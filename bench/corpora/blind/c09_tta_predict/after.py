import glob
import os

import cv2
import numpy as np
import segmentation_models_pytorch as smp
import torch
from torch.utils.data import DataLoader, Dataset

DEVICE = "cuda"
WEIGHTS = sorted(glob.glob("weights/fold*_best.pth"))
THRESHOLD = 0.45


class TestDS(Dataset):
    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        img = cv2.imread(self.paths[i])[:, :, ::-1].astype(np.float32) / 255.0
        img = (img - np.array([0.485, 0.456, 0.406])) / np.array([0.229, 0.224, 0.225])
        return torch.from_numpy(img.transpose(2, 0, 1)).float(), os.path.basename(self.paths[i])


TTA_FNS = [
    (lambda x: x, lambda y: y),
    (lambda x: torch.flip(x, dims=[3]), lambda y: torch.flip(y, dims=[3])),
    (lambda x: torch.flip(x, dims=[2]), lambda y: torch.flip(y, dims=[2])),
    (lambda x: torch.rot90(x, 1, dims=[2, 3]), lambda y: torch.rot90(y, -1, dims=[2, 3])),
]


@torch.no_grad()
def predict_tta(net, images):
    probs = []
    for fwd, inv in TTA_FNS:
        logits = net(fwd(images))
        probs.append(inv(torch.sigmoid(logits)))
    return torch.stack(probs, dim=0).mean(dim=0)


def rle_encode(mask):
    pixels = np.concatenate([[0], mask.flatten(), [0]])
    runs = np.where(pixels[1:] != pixels[:-1])[0] + 1
    runs[1::2] -= runs[::2]
    return " ".join(str(x) for x in runs)


def load_models():
    nets = []
    for w in WEIGHTS:
        net = smp.Unet("efficientnet-b4", encoder_weights=None, classes=1)
        net.load_state_dict(torch.load(w, map_location="cpu"))
        net.to(DEVICE).eval()
        nets.append(net)
    return nets


def main():
    paths = sorted(glob.glob("input/test/*.png"))
    loader = DataLoader(TestDS(paths), batch_size=8, shuffle=False, num_workers=4)
    nets = load_models()
    rows = []
    for images, names in loader:
        images = images.to(DEVICE)
        ens = torch.zeros_like(images[:, :1])
        for net in nets:
            ens += predict_tta(net, images).detach()
        ens /= len(nets)
        masks = (ens > THRESHOLD).squeeze(1).cpu().numpy().astype(np.uint8)
        for name, m in zip(names, masks):
            rows.append(f"{name},{rle_encode(m)}")
    with open("submission.csv", "w") as f:
        f.write("id,rle_mask\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
