import argparse
import math
import os
import time

import torch
import torch.nn as nn


def build_ids(path, vocab=None):
    vocab = {} if vocab is None else vocab
    ids = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            for word in line.split() + ["<eos>"]:
                if word not in vocab:
                    vocab[word] = len(vocab)
                ids.append(vocab[word])
    return torch.tensor(ids, dtype=torch.long), vocab


def batchify(data, bsz, device):
    nbatch = data.size(0) // bsz
    data = data.narrow(0, 0, nbatch * bsz)
    return data.view(bsz, -1).t().contiguous().to(device)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i:i + seq_len], source[i + 1:i + 1 + seq_len].reshape(-1)


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.3):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, x, hidden):
        emb = self.drop(self.encoder(x))
        out, hidden = self.rnn(emb, hidden)
        return self.decoder(self.drop(out)), hidden

    def init_hidden(self, bsz):
        w = next(self.parameters())
        return (w.new_zeros(self.nlayers, bsz, self.nhid),
                w.new_zeros(self.nlayers, bsz, self.nhid))


def train_epoch(model, data, optimizer, criterion, args, ntokens):
    model.train()
    hidden = model.init_hidden(args.batch_size)
    total, start = 0.0, time.time()
    for batch, i in enumerate(range(0, data.size(0) - 1, args.bptt)):
        inputs, targets = get_batch(data, i, args.bptt)
        hidden = repackage_hidden(hidden)
        optimizer.zero_grad()
        output, hidden = model(inputs, hidden)
        loss = criterion(output.view(-1, ntokens), targets)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        total += loss.item()
        if batch % args.log_interval == 0 and batch > 0:
            cur = total / args.log_interval
            print(f"batch {batch} | loss {cur:.2f} | ppl {math.exp(cur):.1f} | {time.time() - start:.1f}s")
            total, start = 0.0, time.time()


def evaluate(model, data, criterion, bsz, bptt, ntokens):
    model.eval()
    total_loss = 0.0
    hidden = model.init_hidden(bsz)
    for i in range(0, data.size(0) - 1, bptt):
        inputs, targets = get_batch(data, i, bptt)
        logits, hidden = model(inputs, hidden)
        total_loss += len(inputs) * criterion(logits.view(-1, ntokens), targets).item()
    return total_loss / (len(data) - 1)


def main():
    parser = argparse.ArgumentParser(description="Word-level LSTM LM on WikiText-103")
    parser.add_argument("--data", default="./data/wikitext-103")
    parser.add_argument("--emsize", type=int, default=400)
    parser.add_argument("--nhid", type=int, default=1150)
    parser.add_argument("--nlayers", type=int, default=3)
    parser.add_argument("--lr", type=float, default=20.0)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--batch_size", type=int, default=80)
    parser.add_argument("--eval_batch_size", type=int, default=10)
    parser.add_argument("--bptt", type=int, default=70)
    parser.add_argument("--log_interval", type=int, default=200)
    parser.add_argument("--save", default="model.pt")
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_ids, vocab = build_ids(os.path.join(args.data, "train.txt"))
    valid_ids, vocab = build_ids(os.path.join(args.data, "valid.txt"), vocab)
    train_data = batchify(train_ids, args.batch_size, device)
    val_data = batchify(valid_ids, args.eval_batch_size, device)
    ntokens = len(vocab)

    model = RNNModel(ntokens, args.emsize, args.nhid, args.nlayers).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    best_val = None
    for epoch in range(1, args.epochs + 1):
        train_epoch(model, train_data, optimizer, criterion, args, ntokens)
        val_loss = evaluate(model, val_data, criterion, args.eval_batch_size, args.bptt, ntokens)
        print(f"| end of epoch {epoch} | valid loss {val_loss:.2f} | valid ppl {math.exp(val_loss):.2f}")
        if best_val is None or val_loss < best_val:
            torch.save(model.state_dict(), args.save)
            best_val = val_loss
        else:
            for group in optimizer.param_groups:
                group["lr"] /= 4.0


if __name__ == "__main__":
    main()
