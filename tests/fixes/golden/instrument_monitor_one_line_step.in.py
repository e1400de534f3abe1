import torch

model = torch.nn.Linear(512, 512).cuda()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for i, x in enumerate(loader):
    model(x.cuda()).square().mean().backward()
    if i % 4 == 3: opt.step(); opt.zero_grad()
