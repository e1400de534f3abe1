import logging
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from torch.utils.data import DataLoader, random_split

from unet import UNet
from utils.data_loading import CarvanaDataset

dir_img = Path("./data/imgs/")
dir_mask = Path("./data/masks/")
dir_checkpoint = Path("./checkpoints/")


def dice_coeff(pred, target, eps=1e-6):
    pred = pred.flatten(1)
    target = target.flatten(1)
    inter = (pred * target).sum(dim=1)
    return ((2 * inter + eps) / (pred.sum(dim=1) + target.sum(dim=1) + eps)).mean()


def run_validation(net, loader, device):
    dice_score = 0.0
    num_batches = 0
    for batch in loader:
        images = batch["image"].to(device=device, dtype=torch.float32)
        true_masks = batch["mask"].to(device=device, dtype=torch.float32)
        mask_pred = net(images)
        mask_pred = (torch.sigmoid(mask_pred) > 0.5).float()
        dice_score += dice_coeff(mask_pred, true_masks).item()
        num_batches += 1
    return dice_score / max(num_batches, 1)


def train_net(net, device, epochs=5, batch_size=4, lr=1e-5, val_percent=0.1, val_every=200):
    dataset = CarvanaDataset(dir_img, dir_mask, scale=0.5)
    n_val = int(len(dataset) * val_percent)
    train_set, val_set = random_split(dataset, [len(dataset) - n_val, n_val],
                                      generator=torch.Generator().manual_seed(0))
    train_loader = DataLoader(train_set, batch_size=batch_size, shuffle=True, num_workers=4)
    val_loader = DataLoader(val_set, batch_size=batch_size, shuffle=False, num_workers=4)

    optimizer = optim.RMSprop(net.parameters(), lr=lr, weight_decay=1e-8, momentum=0.9)
    scheduler = optim.lr_scheduler.ReduceLROnPlateau(optimizer, "max", patience=2)
    criterion = nn.BCEWithLogitsLoss()
    global_step = 0

    for epoch in range(1, epochs + 1):
        net.train()
        for batch in train_loader:
            images = batch["image"].to(device=device, dtype=torch.float32)
            true_masks = batch["mask"].to(device=device, dtype=torch.float32)
            masks_pred = net(images)
            loss = criterion(masks_pred, true_masks)
            loss = loss + (1 - dice_coeff(torch.sigmoid(masks_pred), true_masks))

            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            optimizer.step()
            global_step += 1

            if global_step % val_every == 0:
                net.eval()
                val_score = run_validation(net, val_loader, device)
                net.train()
                scheduler.step(val_score)
                logging.info("step %d  validation dice %.4f", global_step, val_score)

        dir_checkpoint.mkdir(parents=True, exist_ok=True)
        torch.save(net.state_dict(), str(dir_checkpoint / f"checkpoint_epoch{epoch}.pth"))


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    net = UNet(n_channels=3, n_classes=1, bilinear=False).to(device)
    train_net(net, device)
