"""Fine-tune a classifier."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from oom_lsp.runtime import memory_monitor  # pip install oom-lsp


def train(model, loader, optimizer, epochs: int = 10) -> None:
    model.train()
    monitor = memory_monitor()
    for epoch in range(epochs):
        running = 0.0
        for step, (images, labels) in enumerate(loader):
            logits = model(images.cuda(non_blocking=True))
            loss = F.cross_entropy(logits, labels.cuda())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            monitor.step()
            if step % 100 == 0:
                # progress
                print(f"step {step}: {loss.item():.3f}")
            running += loss.item()
        # end of epoch
        print(f"epoch {epoch}: {running / len(loader):.3f}")
        monitor.epoch_end()
    torch.save(model.state_dict(), "model.pt")
