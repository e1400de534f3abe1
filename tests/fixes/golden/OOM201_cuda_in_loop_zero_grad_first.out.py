"""A classifier trained the way most tutorials write it: the batch moved with .cuda()
inside the loop, the gradients cleared, then the loss of the forward pass."""

import torch
import torch.nn as nn

model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 100)).cuda()
criterion = nn.CrossEntropyLoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

for epoch in range(10):
    for features, labels in loader:
        features = features.cuda(non_blocking=True)
        labels = labels.cuda(non_blocking=True)
        optimizer.zero_grad()
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = criterion(model(features), labels)  # mean over the batch
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
