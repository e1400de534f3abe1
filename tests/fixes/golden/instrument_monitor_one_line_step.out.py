import torch
from oom_lsp.runtime import memory_monitor  # pip install oom-lsp

model = torch.nn.Linear(512, 512).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
monitor = memory_monitor(every_n_steps=100)
for i, x in enumerate(loader):
    model(x.cuda()).square().mean().backward()
    if i % 4 == 3: opt.step(); monitor.step(); opt.zero_grad()
