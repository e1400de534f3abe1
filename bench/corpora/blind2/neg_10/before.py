import argparse
import copy

import torch
import torch.nn as nn
import torch.nn.functional as F
import torchvision
from torch.utils.data import DataLoader
from torchvision import transforms


class TwoCrops:
    def __init__(self, tf):
        self.tf = tf

    def __call__(self, img):
        return self.tf(img), self.tf(img)


class MoCo(nn.Module):
    def __init__(self, dim=128, K=65536, m=0.999, T=0.07):
        super().__init__()
        self.K, self.m, self.T = K, m, T
        self.encoder_q = torchvision.models.resnet50(num_classes=dim)
        hidden = self.encoder_q.fc.weight.shape[1]
        self.encoder_q.fc = nn.Sequential(nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, dim))
        self.encoder_k = copy.deepcopy(self.encoder_q)
        self.encoder_k.requires_grad_(False)
        self.register_buffer("queue", F.normalize(torch.randn(dim, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def _momentum_update(self):
        for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            pk.mul_(self.m).add_(pq.detach(), alpha=1 - self.m)

    @torch.no_grad()
    def _dequeue_and_enqueue(self, keys):
        bs = keys.shape[0]
        ptr = int(self.queue_ptr)
        assert self.K % bs == 0
        self.queue[:, ptr:ptr + bs] = keys.t()
        self.queue_ptr[0] = (ptr + bs) % self.K

    def forward(self, im_q, im_k):
        q = F.normalize(self.encoder_q(im_q), dim=1)
        with torch.no_grad():
            self._momentum_update()
            k = F.normalize(self.encoder_k(im_k), dim=1)
        l_pos = (q * k).sum(1, keepdim=True)
        l_neg = q @ self.queue.clone().detach()
        logits = torch.cat([l_pos, l_neg], dim=1) / self.T
        labels = torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)
        self._dequeue_and_enqueue(k)
        return F.cross_entropy(logits, labels)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default="/datasets/imagenet/train")
    parser.add_argument("--epochs", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=256)
    args = parser.parse_args()

    aug = transforms.Compose([
        transforms.RandomResizedCrop(224, scale=(0.2, 1.0)),
        transforms.RandomApply([transforms.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
        transforms.RandomGrayscale(p=0.2), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
        transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    ds = torchvision.datasets.ImageFolder(args.data, TwoCrops(aug))
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, num_workers=16, pin_memory=True, drop_last=True)
    device = torch.device("cuda")
    model = MoCo().to(device)
    optimizer = torch.optim.SGD(model.encoder_q.parameters(), lr=0.03, momentum=0.9, weight_decay=1e-4)
    for epoch in range(args.epochs):
        for i, ((im_q, im_k), _) in enumerate(loader):
            loss = model(im_q.to(device, non_blocking=True), im_k.to(device, non_blocking=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if i % 100 == 0:
                print(f"epoch {epoch} [{i}/{len(loader)}] loss {loss.item():.4f}")
        torch.save(model.state_dict(), f"checkpoints/moco_v2_{epoch:04d}.pth")


if __name__ == "__main__":
    main()
