"""A sequence-to-sequence step: the gradients are cleared between the forward pass and the loss,
and the shapes are checked on the way."""

import torch
from torch import nn

device = torch.device("cuda")
model = Seq2Seq(vocab=32000).to(device)
loss_fn = nn.CrossEntropyLoss(ignore_index=0)
optim = torch.optim.Adam(model.parameters(), lr=1e-4)

for src, tgt in train_dl:
    src, tgt = src.to(device), tgt.to(device)
    tgt_input = tgt[:-1, :]

    # Forward pass
    logits = model(src, tgt_input)
    assert logits.shape[-1] == 32000, "vocabulary size"

    optim.zero_grad()

    # Shift the targets by one
    tgt_out = tgt[1:, :]
    loss = loss_fn(logits.reshape(-1, logits.shape[-1]), tgt_out.reshape(-1))
    loss.backward()
    optim.step()
