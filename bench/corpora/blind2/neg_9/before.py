"""Score a character-level LSTM language model on a long held-out text stream (bits per character)."""
import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CharLSTM(nn.Module):
    def __init__(self, vocab_size=256, emb=256, hidden=2048, layers=3):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, emb)
        self.lstm = nn.LSTM(emb, hidden, layers, batch_first=True)
        self.out = nn.Linear(hidden, vocab_size)
        self.layers, self.hidden = layers, hidden

    def forward(self, x, state=None):
        h, state = self.lstm(self.embed(x), state)
        return self.out(h), state

    def zero_state(self, batch, device):
        shape = (self.layers, batch, self.hidden)
        return torch.zeros(shape, device=device), torch.zeros(shape, device=device)


def load_stream(path, batch, device):
    raw = torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.uint8).long()
    n = raw.numel() // batch
    return raw[: n * batch].view(batch, n).to(device)


def bits_per_char(model, stream, seq_len):
    model.eval()
    state = model.zero_state(stream.size(0), stream.device)
    nll, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, stream.size(1) - 1, seq_len):
            x = stream[:, i:i + seq_len]
            y = stream[:, i + 1:i + 1 + seq_len]
            x = x[:, : y.size(1)]
            logits, state = model(x, state)
            nll += F.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1), reduction="sum").item()
            count += y.numel()
    return nll / count / math.log(2)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", default="checkpoints/char_lstm_enwik8.pt")
    parser.add_argument("--text", default="data/enwik8/test.txt")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq_len", type=int, default=256)
    args = parser.parse_args()

    device = torch.device("cuda")
    model = CharLSTM()
    model.load_state_dict(torch.load(args.checkpoint, map_location="cpu"))
    model.to(device)
    stream = load_stream(args.text, args.batch, device)
    print(f"{args.text}: {bits_per_char(model, stream, args.seq_len):.4f} bpc over {stream.numel()} chars")


if __name__ == "__main__":
    main()
