import logging

import torch
import torch.nn as nn

log = logging.getLogger(__name__)


class SpeechTrainer:
    def __init__(self, acoustic_model, optimizer, blank=0, device="cuda", clip=5.0):
        self.acoustic_model = acoustic_model.to(device)
        self.optimizer = optimizer
        self.ctc = nn.CTCLoss(blank=blank, zero_infinity=True)
        self.device = device
        self.clip = clip
        self.epoch_loss = 0.0
        self.steps = 0

    def reset_stats(self):
        self.epoch_loss = 0.0
        self.steps = 0

    def train_step(self, feats, feat_lens, targets, target_lens):
        feats, targets = feats.to(self.device), targets.to(self.device)
        log_probs = self.acoustic_model(feats).log_softmax(-1).transpose(0, 1)
        loss = self.ctc(log_probs, targets, feat_lens, target_lens)
        self.optimizer.zero_grad()
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.acoustic_model.parameters(), self.clip)
        self.optimizer.step()
        self.epoch_loss += loss.item()
        self.steps += 1
        return loss.item(), float(grad_norm)

    def greedy_decode(self, log_probs, blank=0):
        best = log_probs.argmax(-1).cpu().tolist()
        out = []
        for seq in best:
            collapsed, prev = [], None
            for tok in seq:
                if tok != prev and tok != blank:
                    collapsed.append(tok)
                prev = tok
            out.append(collapsed)
        return out

    def train_epoch(self, loader, epoch):
        self.acoustic_model.train()
        self.reset_stats()
        for i, (feats, feat_lens, targets, target_lens) in enumerate(loader):
            loss, gnorm = self.train_step(feats, feat_lens, targets, target_lens)
            if i % 100 == 0:
                log.info("epoch %d it %d loss %.3f grad_norm %.2f", epoch, i, loss, gnorm)
        mean = self.epoch_loss / max(self.steps, 1)
        log.info("epoch %d mean ctc loss %.4f", epoch, mean)
        return mean

    def fit(self, loader, epochs, scheduler=None):
        history = []
        for epoch in range(epochs):
            history.append(self.train_epoch(loader, epoch))
            if scheduler is not None:
                scheduler.step()
            torch.save(self.acoustic_model.state_dict(), f"am_epoch{epoch}.pt")
        return history
