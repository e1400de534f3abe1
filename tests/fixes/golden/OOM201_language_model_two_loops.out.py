# A character-level language model; only `from torch import ...` at the top.
from torch import nn, optim
from torch.nn import functional as F
import torch

model = CharRNN(vocab_size=96).cuda()
opt = optim.AdamW(model.parameters(), lr=3e-4)

step = 0
while step < 10_000:
    x, y = next(batches)
    x, y = x.cuda(), y.cuda()
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        logits = model(x)
        loss = F.cross_entropy(logits.view(-1, 96), y.view(-1))  # mean over tokens
    loss.backward(); opt.step(); opt.zero_grad()
    step += 1

for x, y in finetune_batches:
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        logits = model(x.cuda())
        if use_label_smoothing:
            loss = F.cross_entropy(logits.view(-1, 96), y.cuda().view(-1), label_smoothing=0.1)
        else:
            loss = F.cross_entropy(logits.view(-1, 96), y.cuda().view(-1))
    loss.backward()
    opt.step()
