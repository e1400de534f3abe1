"""Resume a GPU training run, then evaluate the best weights."""

import os

import torch
from torch import nn

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def save(model, optimizer, scheduler, epoch, out_dir):
    torch.save(
        {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
        os.path.join(out_dir, "last.pt"),
    )
    torch.save(scheduler.state_dict(), os.path.join(out_dir, "scheduler.pt"))
    torch.save(model.state_dict(), os.path.join(out_dir, "best.pt"))


def resume(model: nn.Module, optimizer, scheduler, out_dir):
    model.to(device)
    checkpoint = torch.load(os.path.join(out_dir, "last.pt"))  # weights and optimizer state
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    # a scheduler's state is Python numbers: not flagged
    scheduler.load_state_dict(torch.load(os.path.join(out_dir, "scheduler.pt")))
    return checkpoint["epoch"] + 1


def best(model: nn.Module, out_dir):
    model.load_state_dict(
        torch.load(os.path.join(out_dir, "best.pt"))
    )
    return model.eval()
