import torch


def train_step(model, optimizer, batch):
    inputs, targets = batch
    loss = torch.nn.functional.cross_entropy(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


def fit(model, optimizer, loader, epochs):
    for epoch in range(epochs):
        for batch in loader:
            last = train_step(model, optimizer, batch)
            if last > 10:
                print("diverging", epoch, last)
