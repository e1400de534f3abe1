import json
import math
import time

import torch


def reduce_dict(d, weight_dict):
    return sum(d[k] * weight_dict[k] for k in d if k in weight_dict)


def train_one_epoch(model, criterion, data_loader, optimizer, device, epoch, max_norm=0.1):
    model.train()
    criterion.train()
    step_logs = []
    t0 = time.time()
    for it, (samples, targets) in enumerate(data_loader):
        samples = samples.to(device)
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]

        outputs = model(samples)
        loss_dict = criterion(outputs, targets)
        weight_dict = criterion.weight_dict
        losses = reduce_dict(loss_dict, weight_dict)
        loss_value = losses.item()
        if not math.isfinite(loss_value):
            raise RuntimeError(f"Loss is {loss_value}: {loss_dict}")

        optimizer.zero_grad()
        losses.backward()
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()

        step_logs.append(loss_dict)
        if it % 50 == 0:
            print(f"Epoch [{epoch}] it {it}/{len(data_loader)} loss {loss_value:.4f} "
                  f"lr {optimizer.param_groups[0]['lr']:.2e}")

    keys = step_logs[0].keys()
    summary = {k: torch.stack([log[k] for log in step_logs]).mean().item() for k in keys}
    summary["epoch_time"] = time.time() - t0
    return summary


@torch.no_grad()
def evaluate(model, criterion, data_loader, device):
    model.eval()
    criterion.eval()
    totals, n = {}, 0
    for samples, targets in data_loader:
        samples = samples.to(device)
        targets = [{k: v.to(device) for k, v in t.items()} for t in targets]
        loss_dict = criterion(model(samples), targets)
        for k, v in loss_dict.items():
            totals[k] = totals.get(k, 0.0) + v.item()
        n += 1
    return {k: v / max(n, 1) for k, v in totals.items()}


def main(model, criterion, train_loader, val_loader, args):
    device = torch.device(args.device)
    model.to(device)
    param_dicts = [
        {"params": [p for n, p in model.named_parameters() if "backbone" not in n and p.requires_grad]},
        {"params": [p for n, p in model.named_parameters() if "backbone" in n and p.requires_grad],
         "lr": args.lr_backbone},
    ]
    optimizer = torch.optim.AdamW(param_dicts, lr=args.lr, weight_decay=args.weight_decay)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, args.lr_drop)
    for epoch in range(args.start_epoch, args.epochs):
        train_stats = train_one_epoch(model, criterion, train_loader, optimizer, device, epoch,
                                      args.clip_max_norm)
        lr_scheduler.step()
        val_stats = evaluate(model, criterion, val_loader, device)
        log = {"epoch": epoch, **{f"train_{k}": v for k, v in train_stats.items()},
               **{f"val_{k}": v for k, v in val_stats.items()}}
        with open(f"{args.output_dir}/log.txt", "a") as f:
            f.write(json.dumps(log) + "\n")
