import math
import random
import time

import torch
import torch.nn as nn
from torchtext.data.metrics import bleu_score

from model import Attention, Decoder, Encoder, Seq2Seq

SEED = 1234
random.seed(SEED)
torch.manual_seed(SEED)


def train(model, iterator, optimizer, criterion, clip):
    model.train()
    epoch_loss = 0
    for batch in iterator:
        src, trg = batch.src, batch.trg
        optimizer.zero_grad()
        output = model(src, trg)
        output_dim = output.shape[-1]
        output = output[1:].view(-1, output_dim)
        trg = trg[1:].view(-1)
        loss = criterion(output, trg)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        epoch_loss += loss.item()
    return epoch_loss / len(iterator)


def evaluate(model, iterator, criterion, trg_vocab):
    model.eval()
    epoch_loss = 0
    hyps, refs = [], []
    for batch in iterator:
        src, trg = batch.src, batch.trg
        output = model(src, trg, 0)  # turn off teacher forcing
        output_dim = output.shape[-1]
        pred_tokens = output[1:].argmax(-1).t().tolist()
        for pred, ref in zip(pred_tokens, trg[1:].t().tolist()):
            hyps.append([trg_vocab.itos[i] for i in pred if i > 3])
            refs.append([[trg_vocab.itos[i] for i in ref if i > 3]])
        loss = criterion(output[1:].view(-1, output_dim), trg[1:].view(-1))
        epoch_loss += loss.item()
    return epoch_loss / len(iterator), bleu_score(hyps, refs)


def epoch_time(start_time, end_time):
    elapsed = end_time - start_time
    return int(elapsed / 60), int(elapsed - int(elapsed / 60) * 60)


def run(train_iterator, valid_iterator, SRC, TRG, device, n_epochs=10, clip=1.0):
    attn = Attention(512, 512)
    enc = Encoder(len(SRC.vocab), 256, 512, 512, 0.5)
    dec = Decoder(len(TRG.vocab), 256, 512, 512, 0.5, attn)
    model = Seq2Seq(enc, dec, device).to(device)
    optimizer = torch.optim.Adam(model.parameters())
    criterion = nn.CrossEntropyLoss(ignore_index=TRG.vocab.stoi[TRG.pad_token])
    best_valid_loss = float("inf")

    for epoch in range(n_epochs):
        start_time = time.time()
        train_loss = train(model, train_iterator, optimizer, criterion, clip)
        valid_loss, valid_bleu = evaluate(model, valid_iterator, criterion, TRG.vocab)
        mins, secs = epoch_time(start_time, time.time())
        if valid_loss < best_valid_loss:
            best_valid_loss = valid_loss
            torch.save(model.state_dict(), "tut3-model.pt")
        print(f"Epoch: {epoch + 1:02} | Time: {mins}m {secs}s")
        print(f"\tTrain Loss: {train_loss:.3f} | Train PPL: {math.exp(train_loss):7.3f}")
        print(f"\t Val. Loss: {valid_loss:.3f} |  Val. PPL: {math.exp(valid_loss):7.3f} | BLEU {valid_bleu:.3f}")
