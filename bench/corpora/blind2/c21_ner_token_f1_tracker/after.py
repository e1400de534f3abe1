import argparse
import logging

import torch
from datasets import load_dataset
from torch.utils.data import DataLoader
from transformers import (AutoModelForTokenClassification, AutoTokenizer,
                          DataCollatorForTokenClassification, get_cosine_schedule_with_warmup)

logger = logging.getLogger(__name__)


class TokenF1:
    def __init__(self, num_labels, ignore_label=0):
        self.num_labels = num_labels
        self.ignore_label = ignore_label
        self.preds, self.golds = [], []

    def update(self, logits, labels):
        mask = labels != -100
        self.preds.append(logits.argmax(-1)[mask])
        self.golds.append(labels[mask])

    def compute(self):
        p, g = torch.cat(self.preds), torch.cat(self.golds)
        tp = ((p == g) & (g != self.ignore_label)).sum().float()
        pred_pos = (p != self.ignore_label).sum().float()
        gold_pos = (g != self.ignore_label).sum().float()
        precision, recall = tp / pred_pos.clamp(min=1), tp / gold_pos.clamp(min=1)
        return {"precision": precision.item(), "recall": recall.item(),
                "f1": (2 * precision * recall / (precision + recall).clamp(min=1e-8)).item()}

    def reset(self):
        self.preds, self.golds = [], []


def tokenize_and_align(examples, tokenizer):
    enc = tokenizer(examples["tokens"], is_split_into_words=True, truncation=True, max_length=256)
    all_labels = []
    for i, tags in enumerate(examples["ner_tags"]):
        prev, labels = None, []
        for wid in enc.word_ids(batch_index=i):
            labels.append(-100 if wid is None or wid == prev else tags[wid])
            prev = wid
        all_labels.append(labels)
    enc["labels"] = all_labels
    return enc


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="xlm-roberta-large")
    parser.add_argument("--dataset", default="Babelscape/multinerd")
    parser.add_argument("--num_labels", type=int, default=31)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    raw = load_dataset(args.dataset)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    num_labels = args.num_labels
    train = raw["train"].map(lambda b: tokenize_and_align(b, tokenizer), batched=True,
                             remove_columns=raw["train"].column_names)
    loader = DataLoader(train, batch_size=args.batch_size, shuffle=True,
                        collate_fn=DataCollatorForTokenClassification(tokenizer))

    device = torch.device("cuda")
    model = AutoModelForTokenClassification.from_pretrained(args.model, num_labels=num_labels).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = get_cosine_schedule_with_warmup(optimizer, 500, len(loader) * args.epochs)
    train_metric = TokenF1(num_labels)

    for epoch in range(args.epochs):
        model.train()
        for step, batch in enumerate(loader):
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            outputs.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            train_metric.update(outputs.logits.detach(), batch["labels"])
            if step % 200 == 0:
                logger.info("epoch %d step %d loss %.4f", epoch, step, outputs.loss.item())
        logger.info("epoch %d train %s", epoch, train_metric.compute())
        train_metric.reset()
        model.save_pretrained(f"outputs/ner-epoch{epoch}")


if __name__ == "__main__":
    main()
