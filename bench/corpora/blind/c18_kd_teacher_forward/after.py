import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
import torchvision.transforms as T
from torch.utils.data import DataLoader


def kd_loss(student_logits, teacher_logits, labels, T_=4.0, alpha=0.9):
    soft = F.kl_div(F.log_softmax(student_logits / T_, dim=1),
                    F.softmax(teacher_logits / T_, dim=1),
                    reduction="batchmean") * (T_ * T_)
    hard = F.cross_entropy(student_logits, labels)
    return alpha * soft + (1.0 - alpha) * hard


def accuracy(net, loader, device):
    net.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            correct += (net(x).argmax(1) == y).sum().item()
            total += y.numel()
    return correct / total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--teacher-ckpt", default="resnet56_cifar100.pth")
    ap.add_argument("--epochs", type=int, default=240)
    ap.add_argument("--temperature", type=float, default=4.0)
    args = ap.parse_args()
    device = "cuda"

    norm = T.Normalize((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762))
    train_set = torchvision.datasets.CIFAR100("data", train=True, download=True, transform=T.Compose([
        T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), norm]))
    test_set = torchvision.datasets.CIFAR100("data", train=False, transform=T.Compose([T.ToTensor(), norm]))
    train_loader = DataLoader(train_set, batch_size=128, shuffle=True, num_workers=8)
    test_loader = DataLoader(test_set, batch_size=256, num_workers=8)

    teacher = torchvision.models.resnet50(num_classes=100)
    teacher.load_state_dict(torch.load(args.teacher_ckpt, map_location="cpu"))
    teacher = teacher.to(device)
    teacher.eval()
    student = torchvision.models.resnet18(num_classes=100).to(device)

    optimizer = torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=[150, 180, 210], gamma=0.1)

    for epoch in range(args.epochs):
        student.train()
        for images, labels in train_loader:
            images, labels = images.to(device), labels.to(device)
            with torch.no_grad():
                teacher_logits = teacher(images)
            student_logits = student(images)
            loss = kd_loss(student_logits, teacher_logits, labels, T_=args.temperature)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        scheduler.step()
        acc = accuracy(student, test_loader, device)
        print(f"epoch {epoch}: student top1 {acc:.4f}")
        torch.save(student.state_dict(), "student_kd.pth")


if __name__ == "__main__":
    main()
