"""Fine-tune an MAE-pretrained ViT-L/16 on iNaturalist 2021."""
import argparse
import logging

import timm
import torch
import torch.nn.functional as F
from timm.data import create_transform
from torch.utils.data import DataLoader
from torchvision.datasets import INaturalist

logger = logging.getLogger("finetune")


def interpolate_pos_embed(model, state_dict):
    pos = state_dict["pos_embed"]
    n_extra = model.pos_embed.shape[-2] - model.patch_embed.num_patches
    old = int((pos.shape[-2] - n_extra) ** 0.5)
    new = int(model.patch_embed.num_patches ** 0.5)
    if old != new:
        extra, grid = pos[:, :n_extra], pos[:, n_extra:]
        grid = grid.reshape(1, old, old, -1).permute(0, 3, 1, 2)
        grid = F.interpolate(grid, size=(new, new), mode="bicubic", align_corners=False)
        state_dict["pos_embed"] = torch.cat([extra, grid.permute(0, 2, 3, 1).flatten(1, 2)], dim=1)


def load_pretrained(model, path, device):
    checkpoint = torch.load(path, map_location=device)
    state_dict = checkpoint.get("model", checkpoint)
    for k in ("head.weight", "head.bias"):
        state_dict.pop(k, None)
    interpolate_pos_embed(model, state_dict)
    msg = model.load_state_dict(state_dict, strict=False)
    logger.info("missing keys: %s", msg.missing_keys)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/datasets/inat2021")
    parser.add_argument("--pretrained", default="pretrained/mae_pretrain_vit_large_full.pth")
    parser.add_argument("--input_size", type=int, default=384)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=50)
    parser.add_argument("--blr", type=float, default=5e-4)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    device = torch.device("cuda:0")
    model = timm.create_model("vit_large_patch16_384", pretrained=False, num_classes=10000,
                              drop_path_rate=0.2, global_pool="avg").to(device)
    load_pretrained(model, args.pretrained, device)

    tf = create_transform(args.input_size, is_training=True, auto_augment="rand-m9-mstd0.5-inc1",
                          re_prob=0.25, interpolation="bicubic")
    train_set = INaturalist(args.data, version="2021_train", transform=tf)
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=12,
                        pin_memory=True, drop_last=True)
    lr = args.blr * args.batch_size / 256
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.05, betas=(0.9, 0.999))
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr, total_steps=args.epochs * len(loader),
                                                    pct_start=5 / args.epochs)
    for epoch in range(args.epochs):
        model.train()
        for step, (images, targets) in enumerate(loader):
            images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), targets, label_smoothing=0.1)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            if step % 200 == 0:
                logger.info("epoch %d step %d/%d loss %.4f", epoch, step, len(loader), loss.item())
        torch.save(model.state_dict(), f"output/vitl_inat21_ep{epoch}.pth")


if __name__ == "__main__":
    main()
