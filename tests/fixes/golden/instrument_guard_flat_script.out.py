import torch
from oom_lsp.runtime import oom_guard  # pip install oom-lsp

model = torch.nn.Linear(16, 4).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

# Train.
with oom_guard():
    for epoch in range(5):
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(
                model(x.cuda()),
                y.cuda(),
            )
            # backward
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        print("""epoch
done""", epoch)

torch.save(model.state_dict(), "model.pt")
