"""Noisy-student style training: keep the latest soft prediction per image id for label refinement."""
import torch
import torch.nn as nn
import torch.nn.functional as F


class SoftLabelBank:
    def __init__(self, momentum=0.9):
        self.momentum = momentum
        self.bank = {}

    def get(self, ids, fallback):
        rows = [self.bank.get(i, fallback[k]) for k, i in enumerate(ids)]
        return torch.stack(rows)


def self_distill_epoch(student, loader, optimizer, bank, epoch, device, alpha=0.5, T=2.0):
    student.train()
    pred_by_id = {}
    running, n = 0.0, 0
    for images, labels, image_ids in loader:
        images, labels = images.to(device), labels.to(device)
        logits = student(images)
        one_hot = F.one_hot(labels, logits.size(1)).float()
        targets = bank.get(image_ids.tolist(), one_hot) if epoch > 0 else one_hot
        soft_loss = torch.sum(-targets * F.log_softmax(logits / T, dim=1), dim=1).mean()
        loss = alpha * soft_loss + (1 - alpha) * F.cross_entropy(logits, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

        probs = F.softmax(logits / T, dim=1)
        for k, img_id in enumerate(image_ids.tolist()):
            pred_by_id[img_id] = probs[k].detach()
        running += loss.item() * images.size(0)
        n += images.size(0)

    for img_id, p in pred_by_id.items():
        old = bank.bank.get(img_id)
        new = p if old is None else bank.momentum * old + (1 - bank.momentum) * p
        bank.bank[img_id] = new.detach()
    return running / n


@torch.no_grad()
def top1(student, loader, device):
    student.eval()
    hit = tot = 0
    for images, labels, _ in loader:
        hit += (student(images.to(device)).argmax(1).cpu() == labels).sum().item()
        tot += labels.numel()
    return hit / tot


def run(student, train_loader, val_loader, epochs=60, device="cuda"):
    student.to(device)
    optimizer = torch.optim.SGD(student.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, epochs)
    bank = SoftLabelBank(momentum=0.9)
    for epoch in range(epochs):
        loss = self_distill_epoch(student, train_loader, optimizer, bank, epoch, device)
        scheduler.step()
        print(f"epoch {epoch}: loss {loss:.4f}  val top1 {top1(student, val_loader, device):.4f}")
    return student
