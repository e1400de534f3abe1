import random

import torch
import torch.nn as nn
from transformers import AutoModel, get_cosine_schedule_with_warmup


class MultiTaskModel(nn.Module):
    def __init__(self, encoder_name, task_num_labels):
        super().__init__()
        self.encoder = AutoModel.from_pretrained(encoder_name)
        hidden = self.encoder.config.hidden_size
        self.heads = nn.ModuleDict({t: nn.Linear(hidden, n) for t, n in task_num_labels.items()})
        self.dropout = nn.Dropout(0.1)

    def forward(self, task, input_ids, attention_mask):
        out = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
        pooled = self.dropout(out.last_hidden_state[:, 0])
        return self.heads[task](pooled)


def task_sampler(loaders, temperature=2.0):
    sizes = {t: len(dl) for t, dl in loaders.items()}
    total = sum(sizes.values())
    weights = {t: (n / total) ** (1.0 / temperature) for t, n in sizes.items()}
    iters = {t: iter(dl) for t, dl in loaders.items()}
    tasks = list(loaders)
    while True:
        task = random.choices(tasks, weights=[weights[t] for t in tasks])[0]
        try:
            batch = next(iters[task])
        except StopIteration:
            iters[task] = iter(loaders[task])
            batch = next(iters[task])
        yield task, batch


def train_multitask(mt_model, loaders, num_steps=30_000, lr=3e-5, log_every=500, device="cuda"):
    mt_model.to(device).train()
    optimizer = torch.optim.AdamW(mt_model.parameters(), lr=lr, weight_decay=0.01)
    scheduler = get_cosine_schedule_with_warmup(optimizer, int(0.06 * num_steps), num_steps)
    criterion = nn.CrossEntropyLoss()
    task_loss_sums, task_counts = {}, {}

    for step, (task, batch) in enumerate(task_sampler(loaders), start=1):
        batch = {k: v.to(device) for k, v in batch.items()}
        logits = mt_model(task, batch["input_ids"], batch["attention_mask"])
        loss = criterion(logits, batch["labels"])
        task_loss_sums[task] = task_loss_sums.get(task, 0.0) + loss.item()
        task_counts[task] = task_counts.get(task, 0) + 1

        loss.backward()
        torch.nn.utils.clip_grad_norm_(mt_model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)

        if step % log_every == 0:
            report = {t: float(task_loss_sums[t]) / task_counts[t] for t in task_loss_sums}
            print(f"step {step}: " + ", ".join(f"{t}={v:.4f}" for t, v in sorted(report.items())))
            task_loss_sums, task_counts = {}, {}
        if step >= num_steps:
            break
    return mt_model
