import argparse

import evaluate
import torch
from datasets import load_dataset
from torch.utils.data import DataLoader
from tqdm.auto import tqdm
from transformers import (AutoModelForSequenceClassification, AutoTokenizer,
                          DataCollatorWithPadding, get_scheduler)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--model_name_or_path", default="bert-base-cased")
    p.add_argument("--task_name", default="mrpc")
    p.add_argument("--per_device_batch_size", type=int, default=32)
    p.add_argument("--learning_rate", type=float, default=2e-5)
    p.add_argument("--num_train_epochs", type=int, default=3)
    return p.parse_args()


def main():
    args = parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    raw = load_dataset("glue", args.task_name)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)

    def tokenize(examples):
        return tokenizer(examples["sentence1"], examples["sentence2"], truncation=True, max_length=128)

    ds = raw.map(tokenize, batched=True, remove_columns=["sentence1", "sentence2", "idx"])
    ds = ds.rename_column("label", "labels")
    collator = DataCollatorWithPadding(tokenizer)
    train_dl = DataLoader(ds["train"], shuffle=True, collate_fn=collator,
                          batch_size=args.per_device_batch_size)
    eval_dl = DataLoader(ds["validation"], collate_fn=collator,
                         batch_size=args.per_device_batch_size)

    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, num_labels=2)
    model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    num_steps = args.num_train_epochs * len(train_dl)
    lr_scheduler = get_scheduler("linear", optimizer=optimizer, num_warmup_steps=0,
                                 num_training_steps=num_steps)
    progress = tqdm(range(num_steps))

    for epoch in range(args.num_train_epochs):
        model.train()
        for batch in train_dl:
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            outputs.loss.backward()
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            progress.update(1)

        model.eval()
        metric = evaluate.load("glue", args.task_name)
        for batch in eval_dl:
            batch = {k: v.to(device) for k, v in batch.items()}
            outputs = model(**batch)
            predictions = outputs.logits.argmax(dim=-1)
            metric.add_batch(predictions=predictions, references=batch["labels"])
        print(f"epoch {epoch}:", metric.compute())

    model.save_pretrained("out")
    tokenizer.save_pretrained("out")


if __name__ == "__main__":
    main()
