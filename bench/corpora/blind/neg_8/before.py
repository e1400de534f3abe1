import argparse

import evaluate
import numpy as np
import torch
from datasets import load_dataset
from torch.utils.data import DataLoader
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, get_linear_schedule_with_warmup


def build_loaders(tokenizer, model, bs):
    raw = load_dataset("cnn_dailymail", "3.0.0")

    def prep(batch):
        enc = tokenizer(["summarize: " + a for a in batch["article"]], max_length=512, truncation=True)
        enc["labels"] = tokenizer(text_target=batch["highlights"], max_length=128, truncation=True)["input_ids"]
        return enc

    ds = raw.map(prep, batched=True, remove_columns=raw["train"].column_names)
    collator = DataCollatorForSeq2Seq(tokenizer, model=model)
    return (DataLoader(ds["train"], batch_size=bs, shuffle=True, collate_fn=collator),
            DataLoader(ds["validation"].select(range(2000)), batch_size=bs * 2, collate_fn=collator))


def rouge_eval(s2s, tokenizer, loader, device, num_beams=4):
    s2s.eval()
    rouge = evaluate.load("rouge")
    for batch in loader:
        batch = {k: v.to(device) for k, v in batch.items()}
        generated = s2s.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                 max_new_tokens=128, num_beams=num_beams, early_stopping=True)
        labels = batch["labels"].cpu().numpy()
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        preds = tokenizer.batch_decode(generated, skip_special_tokens=True)
        refs = tokenizer.batch_decode(labels, skip_special_tokens=True)
        rouge.add_batch(predictions=preds, references=refs)
    s2s.train()
    return rouge.compute(use_stemmer=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="t5-small")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--bs", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    s2s = AutoModelForSeq2SeqLM.from_pretrained(args.model).to(device)
    train_dl, val_dl = build_loaders(tokenizer, s2s, args.bs)
    optimizer = torch.optim.AdamW(s2s.parameters(), lr=args.lr)
    scheduler = get_linear_schedule_with_warmup(optimizer, 500, args.epochs * len(train_dl))
    for epoch in range(args.epochs):
        s2s.train()
        for step, batch in enumerate(train_dl):
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = s2s(**batch).loss
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            if step % 500 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")
        print(f"epoch {epoch} ROUGE:", rouge_eval(s2s, tokenizer, val_dl, device))
        s2s.save_pretrained(f"t5-cnndm-epoch{epoch}")


if __name__ == "__main__":
    main()
