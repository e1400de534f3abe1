"""Distil a large LSTM language model into a small one on a continuous token stream."""
import argparse
import logging

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

logger = logging.getLogger("distill")


class LSTMLM(nn.Module):
    def __init__(self, vocab_size, emb_dim, hid_dim, n_layers, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, emb_dim)
        self.lstm = nn.LSTM(emb_dim, hid_dim, n_layers, batch_first=True, dropout=dropout)
        self.proj = nn.Linear(hid_dim, vocab_size)
        self.n_layers, self.hid_dim = n_layers, hid_dim

    def forward(self, tokens, state):
        out, state = self.lstm(self.embed(tokens), state)
        return self.proj(out), state

    def zero_state(self, bsz, device):
        z = torch.zeros(self.n_layers, bsz, self.hid_dim, device=device)
        return (z, z.clone())


def detach_state(state):
    return tuple(s.detach() for s in state)


def stream_batches(path, bsz, bptt, device):
    ids = np.memmap(path, dtype=np.uint16, mode="r")
    per_row = (len(ids) - 1) // bsz
    for start in range(0, per_row - 1, bptt):
        end = min(start + bptt, per_row - 1)
        x = np.stack([ids[r * per_row + start:r * per_row + end] for r in range(bsz)]).astype(np.int64)
        y = np.stack([ids[r * per_row + start + 1:r * per_row + end + 1] for r in range(bsz)]).astype(np.int64)
        yield torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)


def distill_epoch(student, teacher, optimizer, args, device):
    teacher.eval()
    student.train()
    s_state = student.zero_state(args.batch_size, device)
    t_state = teacher.zero_state(args.batch_size, device)
    T = args.temperature
    for step, (x, y) in enumerate(stream_batches(args.train_bin, args.batch_size, args.bptt, device)):
        s_state = detach_state(s_state)
        t_state = detach_state(t_state)
        s_logits, s_state = student(x, s_state)
        t_logits, t_state = teacher(x, t_state)
        kd = F.kl_div(
            F.log_softmax(s_logits / T, dim=-1).flatten(0, 1),
            F.softmax(t_logits.detach() / T, dim=-1).flatten(0, 1),
            reduction="batchmean",
        ) * T * T
        ce = F.cross_entropy(s_logits.flatten(0, 1), y.flatten())
        loss = args.alpha * kd + (1.0 - args.alpha) * ce
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        if step % args.log_every == 0:
            logger.info("step %d kd %.4f ce %.4f", step, kd.item(), ce.item())


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train_bin", default="data/openwebtext/train.bin")
    parser.add_argument("--teacher_ckpt", default="checkpoints/lstm_large.pt")
    parser.add_argument("--vocab_size", type=int, default=50304)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--bptt", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=2.0)
    parser.add_argument("--alpha", type=float, default=0.7)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--log_every", type=int, default=100)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)

    device = torch.device("cuda")
    teacher = LSTMLM(args.vocab_size, 1024, 2048, 4)
    teacher.load_state_dict(torch.load(args.teacher_ckpt, map_location="cpu"))
    teacher.to(device)
    student = LSTMLM(args.vocab_size, 512, 768, 2).to(device)
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3, weight_decay=0.01)
    for epoch in range(args.epochs):
        distill_epoch(student, teacher, optimizer, args, device)
        torch.save(student.state_dict(), f"checkpoints/student_ep{epoch}.pt")


if __name__ == "__main__":
    main()
