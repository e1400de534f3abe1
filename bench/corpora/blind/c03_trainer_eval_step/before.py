import math
import time

import torch
import torch.nn as nn


class Trainer:
    def __init__(self, model, optimizer, train_loader, val_loader, device="cuda",
                 grad_clip=1.0, log_every=100):
        self.model = model.to(device)
        self.optimizer = optimizer
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.device = device
        self.grad_clip = grad_clip
        self.log_every = log_every
        self.criterion = nn.CrossEntropyLoss(ignore_index=-100)
        self.step = 0

    def _to_device(self, batch):
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}

    def train_step(self, batch):
        batch = self._to_device(batch)
        logits = self.model(batch["input_ids"], attention_mask=batch["attention_mask"])
        loss = self.criterion(logits.view(-1, logits.size(-1)), batch["labels"].view(-1))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()
        self.step += 1
        return loss.item()

    def eval_step(self, batch):
        batch = self._to_device(batch)
        logits = self.model(batch["input_ids"], attention_mask=batch["attention_mask"])
        loss = self.criterion(logits.view(-1, logits.size(-1)), batch["labels"].view(-1))
        mask = batch["labels"] != -100
        correct = (logits.argmax(-1)[mask] == batch["labels"][mask]).sum()
        return loss.item(), correct.item(), mask.sum().item()

    def evaluate(self):
        self.model.eval()
        total_loss, total_correct, total_tokens = 0.0, 0, 0
        for batch in self.val_loader:
            loss, correct, n_tokens = self.eval_step(batch)
            total_loss += loss * n_tokens
            total_correct += correct
            total_tokens += n_tokens
        self.model.train()
        avg = total_loss / max(total_tokens, 1)
        return {"val_loss": avg, "val_ppl": math.exp(min(avg, 20)),
                "val_acc": total_correct / max(total_tokens, 1)}

    def fit(self, epochs):
        history = []
        for epoch in range(epochs):
            self.model.train()
            t0 = time.time()
            for batch in self.train_loader:
                loss = self.train_step(batch)
                if self.step % self.log_every == 0:
                    print(f"step {self.step} loss {loss:.4f}")
            metrics = self.evaluate()
            metrics["epoch"] = epoch
            metrics["time"] = time.time() - t0
            history.append(metrics)
            print(metrics)
        return history
