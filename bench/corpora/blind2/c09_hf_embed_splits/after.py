import argparse
import os

import torch
import torch.nn.functional as F
from datasets import load_dataset
from torch.utils.data import DataLoader
from transformers import AutoModel, AutoTokenizer, DataCollatorWithPadding


def mean_pool(last_hidden_state, attention_mask):
    mask = attention_mask.unsqueeze(-1).to(last_hidden_state.dtype)
    return (last_hidden_state * mask).sum(1) / mask.sum(1).clamp(min=1e-6)


def make_loaders(tokenizer, args):
    raw = {
        "corpus": load_dataset("BeIR/msmarco", "corpus", split="corpus"),
        "queries": load_dataset("BeIR/msmarco", "queries", split="queries"),
    }
    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8)
    loaders = {}
    for name, ds in raw.items():
        max_len = args.max_query_len if name == "queries" else args.max_passage_len
        ds = ds.map(lambda b: tokenizer(b["text"], truncation=True, max_length=max_len),
                    batched=True, remove_columns=ds.column_names, num_proc=8)
        loaders[name] = DataLoader(ds, batch_size=args.batch_size, collate_fn=collator, num_workers=4)
    return loaders


def encode_all(model, loaders, device):
    model.eval()
    embeddings = {}
    for split, loader in loaders.items():
        embeddings[split] = []
        for step, batch in enumerate(loader):
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(**batch)
            pooled = mean_pool(out.last_hidden_state.float(), batch["attention_mask"])
            embeddings[split].append(F.normalize(pooled, dim=-1).detach().cpu())
            if step % 1000 == 0:
                print(f"{split}: {step}/{len(loader)} batches")
        embeddings[split] = torch.cat(embeddings[split])
    return embeddings


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model_name", default="sentence-transformers/all-mpnet-base-v2")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--max_query_len", type=int, default=64)
    parser.add_argument("--max_passage_len", type=int, default=256)
    parser.add_argument("--output_dir", default="embeddings/msmarco")
    args = parser.parse_args()

    device = torch.device("cuda")
    tokenizer = AutoTokenizer.from_pretrained(args.model_name)
    model = AutoModel.from_pretrained(args.model_name).to(device)
    loaders = make_loaders(tokenizer, args)
    embeddings = encode_all(model, loaders, device)

    os.makedirs(args.output_dir, exist_ok=True)
    for split, emb in embeddings.items():
        torch.save(emb.cpu().half(), os.path.join(args.output_dir, f"{split}.pt"))
        print(f"saved {split}: {tuple(emb.shape)}")


if __name__ == "__main__":
    main()
