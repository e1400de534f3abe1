import argparse
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from transformers import AutoModel, AutoTokenizer, get_linear_schedule_with_warmup

logger = logging.getLogger(__name__)


class MultiLabelDocs(Dataset):
    def __init__(self, path, tokenizer, num_labels, max_len=512):
        self.rows = [line.rstrip("\n").split("\t", 1) for line in open(path, encoding="utf-8")]
        self.tok, self.num_labels, self.max_len = tokenizer, num_labels, max_len

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        labels, text = self.rows[i]
        enc = self.tok(text, truncation=True, max_length=self.max_len, padding="max_length", return_tensors="pt")
        y = torch.zeros(self.num_labels)
        y[[int(l) for l in labels.split(",")]] = 1.0
        return enc["input_ids"][0], enc["attention_mask"][0], y


class BertXMC(nn.Module):
    def __init__(self, name, num_labels):
        super().__init__()
        self.encoder = AutoModel.from_pretrained(name)
        self.dropout = nn.Dropout(0.2)
        self.classifier = nn.Linear(self.encoder.config.hidden_size, num_labels)

    def forward(self, input_ids, attention_mask):
        cls = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state[:, 0]
        return self.classifier(self.dropout(cls))


def precision_at_k(probs, targets, k):
    topk = probs.topk(k, dim=1).indices
    return targets.gather(1, topk).sum(1).div(k).mean().item()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train_file", default="data/Wiki10-31K/train.tsv")
    parser.add_argument("--num_labels", type=int, default=30938)
    parser.add_argument("--model", default="bert-base-uncased")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    device = torch.device("cuda")
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    train_set = MultiLabelDocs(args.train_file, tokenizer, args.num_labels)
    loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, num_workers=8, drop_last=True)
    model = BertXMC(args.model, args.num_labels).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    total = len(loader) * args.epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, int(0.1 * total), total)

    for epoch in range(args.epochs):
        model.train()
        epoch_probs, epoch_targets = [], []
        for step, (input_ids, attention_mask, labels) in enumerate(loader):
            logits = model(input_ids.to(device), attention_mask.to(device))
            loss = F.binary_cross_entropy_with_logits(logits, labels.to(device))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            epoch_probs.append(torch.sigmoid(logits).detach().cpu())
            epoch_targets.append(labels)
            if step % 500 == 0:
                logger.info("epoch %d step %d/%d loss %.5f", epoch, step, len(loader), loss.item())
        probs = torch.cat(epoch_probs).cpu()
        targets = torch.cat(epoch_targets)
        logger.info("epoch %d train P@1 %.4f P@3 %.4f P@5 %.4f", epoch,
                    precision_at_k(probs, targets, 1), precision_at_k(probs, targets, 3),
                    precision_at_k(probs, targets, 5))
        torch.save(model.state_dict(), f"checkpoints/bert_xmc_ep{epoch}.pt")


if __name__ == "__main__":
    main()
