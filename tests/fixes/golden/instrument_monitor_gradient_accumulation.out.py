"""Fine-tune a language model with gradient accumulation and mixed precision."""

import torch
from torch.optim.lr_scheduler import CosineAnnealingLR
from oom_lsp.runtime import memory_monitor  # pip install oom-lsp


def train(model, loader, epochs: int = 3, accumulation_steps: int = 8) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    scheduler = CosineAnnealingLR(optimizer, T_max=len(loader) // accumulation_steps)
    scaler = torch.amp.GradScaler("cuda")
    monitor = memory_monitor()
    for epoch in range(epochs):
        for micro_step, batch in enumerate(loader):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**batch).loss / accumulation_steps
            scaler.scale(loss).backward()
            if (micro_step + 1) % accumulation_steps == 0:
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                scaler.step(optimizer)
                monitor.step()
                scaler.update()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
            if micro_step % 100 == 0:
                print(f"epoch {epoch} micro-step {micro_step}: {loss.item():.3f}")
        monitor.epoch_end()
