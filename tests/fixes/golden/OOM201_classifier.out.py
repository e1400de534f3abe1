"""ResNet-18 on CIFAR-10, the way the tutorial does it."""

import torch
import torch.nn as nn
import torchvision

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train_one_epoch(model, loader, optimizer, criterion):
    model.train()
    running = 0.0
    for step, (images, labels) in enumerate(loader):
        images = images.to(device, non_blocking=True)
        labels = labels.to(device, non_blocking=True)

        # Forward pass.
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            logits = model(
                images,
            )  # (N, 10)
            loss = criterion(logits, labels)

        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        running += loss.item()
    return running / len(loader)


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    correct = 0
    for images, labels in loader:
        logits = model(images.to(device))
        correct += (logits.argmax(1) == labels.to(device)).sum().item()
    return correct / len(loader.dataset)


model = torchvision.models.resnet18(num_classes=10).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
criterion = nn.CrossEntropyLoss()
