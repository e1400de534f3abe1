"""Build a CLIP image-embedding index over a webdataset shard collection."""
import argparse
import json
import os

import open_clip
import torch
import webdataset as wds


def build_pipeline(shards, preprocess, batch_size, workers):
    dataset = (
        wds.WebDataset(shards, shardshuffle=False)
        .decode("pilrgb")
        .to_tuple("jpg", "__key__")
        .map_tuple(preprocess, lambda k: k)
        .batched(batch_size, partial=True)
    )
    return wds.WebLoader(dataset, batch_size=None, num_workers=workers)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shards", default="/data/laion400m/{00000..00999}.tar")
    parser.add_argument("--model", default="ViT-L-14")
    parser.add_argument("--pretrained", default="laion2b_s32b_b82k")
    parser.add_argument("--batch_size", type=int, default=512)
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--out_dir", default="index/laion_subset")
    args = parser.parse_args()

    device = torch.device("cuda")
    model, _, preprocess = open_clip.create_model_and_transforms(args.model, pretrained=args.pretrained)
    model = model.to(device).eval()
    loader = build_pipeline(args.shards, preprocess, args.batch_size, args.workers)

    chunks = []
    keys = []
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
        for i, (images, batch_keys) in enumerate(loader):
            emb = model.encode_image(images.to(device, non_blocking=True))
            emb = emb / emb.norm(dim=-1, keepdim=True)
            chunks.append(emb.half().cpu())
            keys.extend(batch_keys)
            if i % 500 == 0:
                print(f"{len(keys)} images embedded")

    index = torch.cat(chunks, dim=0)
    os.makedirs(args.out_dir, exist_ok=True)
    torch.save(index, os.path.join(args.out_dir, "image_emb.pt"))
    with open(os.path.join(args.out_dir, "keys.json"), "w") as f:
        json.dump(keys, f)
    print(f"index: {tuple(index.shape)}")


if __name__ == "__main__":
    main()
