"""Whole-slide inference: tile a large image, run the segmentation net, stitch the output."""
import argparse

import numpy as np
import tifffile
import torch
import torch.nn.functional as F

from nets import build_segmenter


def gaussian_weight(size, sigma_scale=0.125, device="cpu"):
    coords = torch.arange(size, dtype=torch.float32, device=device) - (size - 1) / 2
    g = torch.exp(-(coords ** 2) / (2 * (size * sigma_scale) ** 2))
    w = g[:, None] * g[None, :]
    return (w / w.max()).clamp_min(1e-3)


def tile_starts(length, tile, stride):
    starts = list(range(0, max(length - tile, 0) + 1, stride))
    if starts[-1] + tile < length:
        starts.append(length - tile)
    return starts


def sliding_window_predict(net, image, num_classes, tile=512, overlap=0.5, batch_size=8):
    _, _, H, W = image.shape
    stride = int(tile * (1 - overlap))
    weight = gaussian_weight(tile, device=image.device)
    canvas = torch.zeros(1, num_classes, H, W, device=image.device)
    norm = torch.zeros(1, 1, H, W, device=image.device)
    coords = [(y, x) for y in tile_starts(H, tile, stride) for x in tile_starts(W, tile, stride)]
    for i in range(0, len(coords), batch_size):
        chunk = coords[i:i + batch_size]
        patches = torch.cat([image[:, :, y:y + tile, x:x + tile] for y, x in chunk], dim=0)
        logits = net(patches)
        probs = F.softmax(logits, dim=1) * weight
        for k, (y, x) in enumerate(chunk):
            canvas[:, :, y:y + tile, x:x + tile] += probs[k:k + 1]
            norm[:, :, y:y + tile, x:x + tile] += weight
    return canvas / norm


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("slide")
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--out", default="mask.tif")
    ap.add_argument("--classes", type=int, default=4)
    ap.add_argument("--tile", type=int, default=512)
    args = ap.parse_args()

    device = torch.device("cuda")
    net = build_segmenter("unetplusplus", encoder="resnet34", classes=args.classes)
    net.load_state_dict(torch.load(args.ckpt, map_location="cpu")["state_dict"])
    net = net.to(device).eval()

    img = tifffile.imread(args.slide).astype(np.float32) / 255.0
    img = torch.from_numpy(img).permute(2, 0, 1).unsqueeze(0).to(device)
    img = (img - 0.5) / 0.25
    probs = sliding_window_predict(net, img, args.classes, tile=args.tile)
    mask = probs.argmax(dim=1)[0].to(torch.uint8).cpu().numpy()
    tifffile.imwrite(args.out, mask, compression="zlib")
    print("classes present:", np.unique(mask).tolist())


if __name__ == "__main__":
    main()
