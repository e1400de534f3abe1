import torch
from oom_lsp.runtime import memory_monitor  # pip install oom-lsp

model = torch.nn.Linear(16, 4)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
step = 0
monitor = memory_monitor(every_n_steps=100)
while step < 10_000:
    x = torch.randn(64, 16)
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    monitor.step()
    optimizer.zero_grad()
    step += 1
