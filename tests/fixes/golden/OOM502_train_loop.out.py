import torch
from torch.cuda import empty_cache


def train(model, loader, optimizer, scaler, epochs=3):
    for epoch in range(epochs):
        for step, (x, y) in enumerate(loader):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x.cuda(), y.cuda())
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
            # try to avoid fragmentation
            if torch.cuda.memory_allocated() > 70e9:
                pass
            if step % 1000 == 0:
                torch.cuda.empty_cache()  # periodic: not flagged
        torch.cuda.empty_cache()  # once per epoch: not flagged
