import torch

model = torch.nn.Linear(4096, 4096).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

for batch in loader:
    optimizer.zero_grad(set_to_none=True)
    model(batch).sum().backward()
    optimizer.step()
    model.zero_grad(True)  # clear
    model.zero_grad(set_to_none=keep)  # unknown value: not flagged
