"""Extract patch features from whole-slide images for multiple-instance learning."""
import argparse
import os

import h5py
import numpy as np
import openslide
import timm
import torch
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms


class SlidePatches(Dataset):
    def __init__(self, slide_path, coords_path, patch_size=256, level=0):
        with h5py.File(coords_path, "r") as f:
            self.coords = f["coords"][:]
        self.slide_path, self.patch_size, self.level = slide_path, patch_size, level
        self.slide = None
        self.tf = transforms.Compose([
            transforms.Resize(224),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ])

    def __len__(self):
        return len(self.coords)

    def __getitem__(self, idx):
        if self.slide is None:
            self.slide = openslide.OpenSlide(self.slide_path)
        x, y = self.coords[idx]
        img = self.slide.read_region((int(x), int(y)), self.level, (self.patch_size, self.patch_size)).convert("RGB")
        return self.tf(img), torch.from_numpy(self.coords[idx])


@torch.no_grad()
def extract_slide(model, loader, device, feat_dim):
    slide_feats = []
    for patches, _ in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            feats = model(patches.to(device, non_blocking=True))
        slide_feats.append(feats.float().cpu())
    return torch.cat(slide_feats, dim=0)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--slides", default="/data/tcga_brca/slides")
    parser.add_argument("--coords", default="/data/tcga_brca/patches_20x")
    parser.add_argument("--out", default="/data/tcga_brca/features_uni")
    parser.add_argument("--batch_size", type=int, default=512)
    args = parser.parse_args()

    device = torch.device("cuda")
    model = timm.create_model("vit_large_patch16_224", pretrained=False, num_classes=0, init_values=1e-5)
    model.load_state_dict(torch.load("weights/uni_vit_l.bin", map_location="cpu"), strict=True)
    model.to(device).eval()
    os.makedirs(args.out, exist_ok=True)

    for name in sorted(os.listdir(args.slides)):
        slide_id = os.path.splitext(name)[0]
        ds = SlidePatches(os.path.join(args.slides, name), os.path.join(args.coords, slide_id + ".h5"))
        loader = DataLoader(ds, batch_size=args.batch_size, num_workers=12, pin_memory=True)
        feats = extract_slide(model, loader, device, model.num_features)
        with h5py.File(os.path.join(args.out, slide_id + ".h5"), "w") as f:
            f.create_dataset("features", data=feats.numpy().astype(np.float16))
            f.create_dataset("coords", data=ds.coords)
        print(f"{slide_id}: {feats.shape[0]} patches")


if __name__ == "__main__":
    main()
