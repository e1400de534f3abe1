import copy

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader


class EarlyStopping:
    def __init__(self, patience=7, min_delta=0.0):
        self.patience = patience
        self.min_delta = min_delta
        self.best = np.inf
        self.counter = 0
        self.best_state = None

    def __call__(self, val_loss, model):
        if val_loss < self.best - self.min_delta:
            self.best = val_loss
            self.counter = 0
            self.best_state = copy.deepcopy(model.state_dict())
            return False
        self.counter += 1
        return self.counter >= self.patience


def compute_val_loss(net, loader, criterion, device):
    total, n = 0.0, 0
    for x_num, x_cat, target in loader:
        x_num, x_cat, target = x_num.to(device), x_cat.to(device), target.to(device)
        out = net(x_num, x_cat)
        total += criterion(out, target).item() * target.size(0)
        n += target.size(0)
    return total / n


def fit(net, train_ds, val_ds, epochs=200, lr=3e-4, batch_size=1024, device="cuda"):
    train_loader = DataLoader(train_ds, batch_size=batch_size, shuffle=True, drop_last=True)
    val_loader = DataLoader(val_ds, batch_size=batch_size * 4)
    criterion = nn.BCEWithLogitsLoss()
    optimizer = torch.optim.Adam(net.parameters(), lr=lr)
    scheduler = torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=3)
    stopper = EarlyStopping(patience=10)
    net.to(device)

    for epoch in range(epochs):
        net.train()
        train_loss = 0.0
        for x_num, x_cat, target in train_loader:
            x_num, x_cat, target = x_num.to(device), x_cat.to(device), target.to(device)
            optimizer.zero_grad()
            loss = criterion(net(x_num, x_cat), target)
            loss.backward()
            optimizer.step()
            train_loss += loss.item()

        net.eval()
        val_loss = compute_val_loss(net, val_loader, criterion, device)
        scheduler.step(val_loss)
        print(f"epoch {epoch:3d} train {train_loss / len(train_loader):.5f} val {val_loss:.5f}")
        if stopper(val_loss, net):
            print(f"early stopping at epoch {epoch}, best val {stopper.best:.5f}")
            break

    net.load_state_dict(stopper.best_state)
    return net
