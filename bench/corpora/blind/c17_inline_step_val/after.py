import math
import os
import time

import numpy as np
import torch

from model import GPT, GPTConfig

out_dir = "out-shakespeare-char"
eval_interval = 250
eval_iters = 200
batch_size = 64
block_size = 256
max_iters = 5000
learning_rate = 1e-3
min_lr = 1e-4
warmup_iters = 100
device = "cuda"
dtype = torch.bfloat16

data_dir = os.path.join("data", "shakespeare_char")
train_data = np.memmap(os.path.join(data_dir, "train.bin"), dtype=np.uint16, mode="r")
val_data = np.memmap(os.path.join(data_dir, "val.bin"), dtype=np.uint16, mode="r")


def get_batch(split):
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i:i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1:i + 1 + block_size].astype(np.int64)) for i in ix])
    return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)


def get_lr(it):
    if it < warmup_iters:
        return learning_rate * it / warmup_iters
    ratio = (it - warmup_iters) / (max_iters - warmup_iters)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (learning_rate - min_lr)


model = GPT(GPTConfig(n_layer=6, n_head=6, n_embd=384, block_size=block_size, vocab_size=65, dropout=0.2))
model.to(device)
optimizer = model.configure_optimizers(0.1, learning_rate, (0.9, 0.99), "cuda")
ctx = torch.autocast(device_type="cuda", dtype=dtype)
best_val_loss = 1e9
X, Y = get_batch("train")
t0 = time.time()

for iter_num in range(max_iters + 1):
    for group in optimizer.param_groups:
        group["lr"] = get_lr(iter_num)

    if iter_num % eval_interval == 0:
        model.eval()
        out = {}
        with torch.no_grad():
            for split in ("train", "val"):
                losses = torch.zeros(eval_iters)
                for k in range(eval_iters):
                    xb, yb = get_batch(split)
                    with ctx:
                        _, split_loss = model(xb, yb)
                    losses[k] = split_loss.item()
                out[split] = losses.mean().item()
        model.train()
        print(f"step {iter_num}: train loss {out['train']:.4f}, val loss {out['val']:.4f}")
        if out["val"] < best_val_loss:
            best_val_loss = out["val"]
            torch.save({"model": model.state_dict(), "iter_num": iter_num}, os.path.join(out_dir, "ckpt.pt"))

    with ctx:
        logits, loss = model(X, Y)
    X, Y = get_batch("train")
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    if iter_num % 10 == 0:
        dt, t0 = time.time() - t0, time.time()
        print(f"iter {iter_num}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms")
