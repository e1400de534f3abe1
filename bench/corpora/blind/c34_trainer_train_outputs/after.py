import torch
import torch.nn as nn
from sklearn.metrics import f1_score


class TextClassifierEngine:
    def __init__(self, model, optimizer, scheduler=None, device="cuda", num_labels=6, threshold=0.5):
        self.model = model.to(device)
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.device = device
        self.num_labels = num_labels
        self.threshold = threshold
        self.loss_fn = nn.BCEWithLogitsLoss()
        self.train_outputs = []
        self.global_step = 0

    def move(self, batch):
        return {k: v.to(self.device) for k, v in batch.items()}

    def train_step(self, batch):
        batch = self.move(batch)
        logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        loss = self.loss_fn(logits, batch["labels"].float())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.optimizer.zero_grad()
        if self.scheduler is not None:
            self.scheduler.step()
        self.global_step += 1
        self.train_outputs.append({"logits": logits.detach(), "labels": batch["labels"], "loss": loss.item()})
        return loss.item()

    def on_train_epoch_end(self):
        logits = torch.cat([o["logits"] for o in self.train_outputs])
        labels = torch.cat([o["labels"] for o in self.train_outputs])
        preds = (torch.sigmoid(logits) > self.threshold).int().cpu().numpy()
        micro = f1_score(labels.cpu().numpy(), preds, average="micro", zero_division=0)
        mean_loss = sum(o["loss"] for o in self.train_outputs) / len(self.train_outputs)
        self.train_outputs.clear()
        return {"train_loss": mean_loss, "train_f1": micro}

    @torch.no_grad()
    def eval_epoch(self, loader):
        self.model.eval()
        all_preds, all_labels = [], []
        for batch in loader:
            batch = self.move(batch)
            logits = self.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            all_preds.append((torch.sigmoid(logits) > self.threshold).int().cpu())
            all_labels.append(batch["labels"].cpu())
        self.model.train()
        y_true = torch.cat(all_labels).numpy()
        y_pred = torch.cat(all_preds).numpy()
        return {"val_f1": f1_score(y_true, y_pred, average="micro", zero_division=0)}

    def fit(self, train_loader, val_loader, epochs):
        for epoch in range(epochs):
            self.model.train()
            for batch in train_loader:
                self.train_step(batch)
            stats = self.on_train_epoch_end()
            stats.update(self.eval_epoch(val_loader))
            print(f"epoch {epoch}: {stats}")
