import argparse

import torch
from torch.utils.data import DataLoader
from transformers import AutoTokenizer, GPT2LMHeadModel, get_linear_schedule_with_warmup

from data import load_story_dataset

PROMPTS = [
    "Once upon a time",
    "The little robot looked at",
    "In the middle of the night,",
    "She opened the door and",
]


def distinct_n(texts, n=2):
    ngrams, total = set(), 0
    for t in texts:
        toks = t.split()
        for i in range(len(toks) - n + 1):
            ngrams.add(tuple(toks[i:i + n]))
            total += 1
    return len(ngrams) / max(total, 1)


def sample_continuations(model, tokenizer, prompts, max_new_tokens=64, temperature=0.8, top_k=50):
    device = next(model.parameters()).device
    texts = []
    for prompt in prompts:
        input_ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
        generated = input_ids
        past = None
        next_ids = input_ids
        for _ in range(max_new_tokens):
            out = model(input_ids=next_ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            logits = out.logits[:, -1, :] / temperature
            v, _ = torch.topk(logits, top_k)
            logits[logits < v[:, [-1]]] = -float("inf")
            next_ids = torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)
            generated = torch.cat([generated, next_ids], dim=1)
            if next_ids.item() == tokenizer.eos_token_id:
                break
        texts.append(tokenizer.decode(generated[0], skip_special_tokens=True))
    return texts


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="gpt2")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--bs", type=int, default=8)
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    tokenizer.pad_token = tokenizer.eos_token
    model = GPT2LMHeadModel.from_pretrained(args.model).to(device)
    train_ds = load_story_dataset(tokenizer, split="train", block_size=256)
    loader = DataLoader(train_ds, batch_size=args.bs, shuffle=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    total = len(loader) * args.epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, int(0.05 * total), total)

    for epoch in range(args.epochs):
        model.train()
        for step, batch in enumerate(loader):
            batch = {k: v.to(device) for k, v in batch.items()}
            loss = model(**batch, labels=batch["input_ids"]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            if step % 200 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.3f}")

        model.eval()
        samples = sample_continuations(model, tokenizer, PROMPTS)
        for s in samples:
            print("---", s)
        print(f"epoch {epoch} distinct-2 {distinct_n(samples):.3f}")
        model.save_pretrained(f"ckpt/epoch{epoch}")


if __name__ == "__main__":
    main()
