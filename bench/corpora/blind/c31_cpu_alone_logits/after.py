import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader
from torchvision import datasets, transforms


class ConvNet(nn.Module):
    def __init__(self, num_classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3, 1), nn.ReLU(),
            nn.Conv2d(32, 64, 3, 1), nn.ReLU(), nn.MaxPool2d(2), nn.Dropout(0.25),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(9216, 128), nn.ReLU(), nn.Dropout(0.5), nn.Linear(128, num_classes),
        )

    def forward(self, x):
        return self.classifier(self.features(x))


def train(args, net, device, loader, optimizer, epoch):
    net.train()
    all_logits, all_labels = [], []
    for batch_idx, (data, target) in enumerate(loader):
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        logits = net(data)
        loss = F.cross_entropy(logits, target)
        loss.backward()
        optimizer.step()
        all_logits.append(logits.detach().cpu())
        all_labels.append(target.cpu())
        if batch_idx % args.log_interval == 0:
            print(f"Train Epoch: {epoch} [{batch_idx * len(data)}/{len(loader.dataset)}]\tLoss: {loss.item():.6f}")
    logits = torch.cat(all_logits)
    labels = torch.cat(all_labels)
    train_acc = (logits.argmax(dim=1) == labels).float().mean().item()
    per_class = [(logits.argmax(1)[labels == c] == c).float().mean().item() for c in range(10)]
    return train_acc, per_class


def test(net, device, loader):
    net.eval()
    correct = 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            correct += net(data).argmax(dim=1).eq(target).sum().item()
    return correct / len(loader.dataset)


def main():
    parser = argparse.ArgumentParser(description="MNIST")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--epochs", type=int, default=14)
    parser.add_argument("--lr", type=float, default=1.0)
    parser.add_argument("--log-interval", type=int, default=100)
    args = parser.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
    train_loader = DataLoader(datasets.MNIST("../data", train=True, download=True, transform=tf),
                              batch_size=args.batch_size, shuffle=True)
    test_loader = DataLoader(datasets.MNIST("../data", train=False, transform=tf), batch_size=1000)
    net = ConvNet().to(device)
    optimizer = torch.optim.Adadelta(net.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(1, args.epochs + 1):
        train_acc, per_class = train(args, net, device, train_loader, optimizer, epoch)
        test_acc = test(net, device, test_loader)
        scheduler.step()
        print(f"epoch {epoch}: train acc {train_acc:.4f} test acc {test_acc:.4f}")
        print("per-class train acc:", [round(a, 3) for a in per_class])


if __name__ == "__main__":
    main()
