import argparse
from collections import deque

import torch
import torch.nn.functional as F
from datasets import load_dataset
from torch.utils.data import DataLoader
from transformers import AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding


class SmoothedValue:
    """Tracks the last `window` per-step values without syncing the GPU every step."""

    def __init__(self, window=50):
        self.values = deque(maxlen=window)

    def update(self, value):
        self.values.append(value.detach())

    @property
    def avg(self):
        return torch.stack(list(self.values)).mean().item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="microsoft/deberta-v3-large")
    parser.add_argument("--task", default="mnli")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--log_every", type=int, default=50)
    args = parser.parse_args()

    tok = AutoTokenizer.from_pretrained(args.model)
    raw = load_dataset("glue", args.task, split="train")
    ds = raw.map(lambda b: tok(b["premise"], b["hypothesis"], truncation=True, max_length=256), batched=True,
                 remove_columns=["premise", "hypothesis", "idx"])
    ds = ds.rename_column("label", "labels")
    loader = DataLoader(ds, batch_size=args.batch_size, shuffle=True, collate_fn=DataCollatorWithPadding(tok))

    device = torch.device("cuda")
    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=3).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    loss_meter, acc_meter = SmoothedValue(args.log_every), SmoothedValue(args.log_every)
    step = 0
    for epoch in range(args.epochs):
        model.train()
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            out = model(**batch)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            loss_meter.update(out.loss)
            acc_meter.update((out.logits.argmax(-1) == batch["labels"]).float().mean())
            step += 1
            if step % args.log_every == 0:
                print(f"epoch {epoch} step {step} loss {loss_meter.avg:.4f} acc {acc_meter.avg:.4f}")
        model.save_pretrained(f"outputs/{args.task}-epoch{epoch}")


if __name__ == "__main__":
    main()
