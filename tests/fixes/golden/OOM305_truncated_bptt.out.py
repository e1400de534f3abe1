import torch
import torch.nn as nn


class CharModel(nn.Module):
    def __init__(self, vocab: int, hidden: int = 512) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.lstm = nn.LSTM(hidden, hidden, num_layers=2, batch_first=True)
        self.out = nn.Linear(hidden, vocab)

    def forward(self, tokens, state=None):
        output, state = self.lstm(self.embed(tokens), state)
        return self.out(output), state


def train_lstm(model: CharModel, batches, optimizer):
    criterion = nn.CrossEntropyLoss()
    state = None
    for inputs, targets in batches:
        if state is not None:
            state = tuple(h.detach() for h in state) if isinstance(state, tuple) else state.detach()
        optimizer.zero_grad()
        logits, state = model(inputs, state)
        loss = criterion(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()


def train_gru(sequences, optimizer):
    gru = nn.GRU(32, 64)
    h = torch.zeros(1, 16, 64)
    for x, y in sequences:
        h = h.detach()
        out, h = gru(x, h)
        nn.functional.mse_loss(out, y).backward()
        optimizer.step()


def train_cell(lstm, chunks, optimizer, h, c):
    for chunk in chunks:
        h, c = h.detach(), c.detach()
        out, (h, c) = lstm(chunk, (h, c))
        out.pow(2).mean().backward()
        optimizer.step()
