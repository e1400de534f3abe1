"""Deep-supervision training: every decoder stage predicts a mask and contributes to the loss."""
import torch
import torch.nn as nn
import torch.nn.functional as F


def dice_loss(logits, target, eps=1.0):
    p = torch.sigmoid(logits).flatten(1)
    t = target.flatten(1)
    return 1 - ((2 * (p * t).sum(1) + eps) / (p.sum(1) + t.sum(1) + eps)).mean()


def stage_loss(logits, target):
    if logits.shape[-2:] != target.shape[-2:]:
        target = F.interpolate(target, size=logits.shape[-2:], mode="nearest")
    return F.binary_cross_entropy_with_logits(logits, target) + dice_loss(logits, target)


def train_epoch(seg_net, loader, optimizer, scaler, device, ds_weights=(1.0, 0.5, 0.25, 0.125)):
    seg_net.train()
    epoch_total = 0.0
    for step, (images, masks) in enumerate(loader):
        images, masks = images.to(device), masks.to(device)
        with torch.autocast("cuda", dtype=torch.float16):
            stage_outputs = seg_net(images)
        losses = []
        for w, out in zip(ds_weights, stage_outputs):
            losses.append(w * stage_loss(out.float(), masks))
        total = sum(losses) / sum(ds_weights)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(total).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(seg_net.parameters(), 12.0)
        scaler.step(optimizer)
        scaler.update()
        epoch_total += total.item()
        if step % 50 == 0:
            print(f"step {step}: " + " ".join(f"{l.item():.4f}" for l in losses))
    return epoch_total / len(loader)


@torch.no_grad()
def val_dice(seg_net, loader, device):
    seg_net.eval()
    scores = []
    for images, masks in loader:
        pred = (torch.sigmoid(seg_net(images.to(device))[0]) > 0.5).float()
        scores.append(1 - dice_loss(torch.logit(pred.clamp(1e-4, 1 - 1e-4)), masks.to(device)).item())
    return sum(scores) / len(scores)


def main(seg_net, train_loader, val_loader, epochs=300, device="cuda"):
    seg_net.to(device)
    optimizer = torch.optim.SGD(seg_net.parameters(), lr=1e-2, momentum=0.99, nesterov=True, weight_decay=3e-5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda e: (1 - e / epochs) ** 0.9)
    scaler = torch.cuda.amp.GradScaler()
    for epoch in range(epochs):
        tr = train_epoch(seg_net, train_loader, optimizer, scaler, device)
        scheduler.step()
        vd = val_dice(seg_net, val_loader, device)
        print(f"epoch {epoch}: train loss {tr:.4f} val dice {vd:.4f}")
        torch.save(seg_net.state_dict(), "model_latest.pt")
