import logging
import os

import torch
import torch.nn as nn
from torch.cuda.amp import GradScaler, autocast

logger = logging.getLogger(__name__)


class ClassificationTrainer:
    def __init__(self, net, optimizer, scheduler, train_loader, val_loader, cfg):
        self.net = net
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.cfg = cfg
        self.device = torch.device(cfg.get("device", "cuda"))
        self.criterion = nn.CrossEntropyLoss(label_smoothing=cfg.get("label_smoothing", 0.0))
        self.scaler = GradScaler(enabled=cfg.get("amp", True))
        self.epoch = 0
        self.epoch_loss = 0.0
        self.num_batches = 0

    def on_epoch_start(self):
        self.net.train()
        self.epoch_loss = 0.0
        self.num_batches = 0

    def train_step(self, images, labels):
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        with autocast(enabled=self.cfg.get("amp", True)):
            logits = self.net(images)
            loss = self.criterion(logits, labels)
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.scheduler.step()
        self.epoch_loss += loss.item()
        self.num_batches += 1
        return loss

    @torch.no_grad()
    def validate(self):
        self.net.eval()
        correct, seen = 0, 0
        for images, labels in self.val_loader:
            images, labels = images.to(self.device), labels.to(self.device)
            correct += (self.net(images).argmax(1) == labels).sum().item()
            seen += labels.numel()
        return correct / max(seen, 1)

    def on_epoch_end(self):
        mean_loss = self.epoch_loss / max(self.num_batches, 1)
        acc = self.validate()
        logger.info("epoch %d train_loss %.4f val_acc %.4f", self.epoch, float(mean_loss), acc)
        os.makedirs(self.cfg["out_dir"], exist_ok=True)
        torch.save({"epoch": self.epoch, "net": self.net.state_dict()},
                   os.path.join(self.cfg["out_dir"], "last.pt"))
        self.epoch += 1

    def fit(self):
        for _ in range(self.cfg["epochs"]):
            self.on_epoch_start()
            for images, labels in self.train_loader:
                self.train_step(images, labels)
            self.on_epoch_end()
