import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
import torch.nn as nn
import torch.nn.functional as F


def fit(network, train_dl, valid_dl, epochs, lr, device):
    history = {"loss": [], "val_loss": [], "val_acc": []}
    opt = torch.optim.Adam(network.parameters(), lr=lr)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, epochs=epochs, steps_per_epoch=len(train_dl))
    for epoch in range(epochs):
        network.train()
        for xb, yb in train_dl:
            xb, yb = xb.to(device), yb.to(device)
            loss = F.cross_entropy(network(xb), yb)
            loss.backward()
            opt.step()
            opt.zero_grad()
            sched.step()
            history["loss"].append(loss)

        network.eval()
        with torch.no_grad():
            tot_loss, tot_correct, n = 0.0, 0, 0
            for xb, yb in valid_dl:
                xb, yb = xb.to(device), yb.to(device)
                out = network(xb)
                tot_loss += F.cross_entropy(out, yb, reduction="sum").item()
                tot_correct += (out.argmax(1) == yb).sum().item()
                n += yb.numel()
        history["val_loss"].append(tot_loss / n)
        history["val_acc"].append(tot_correct / n)
        print(f"Epoch [{epoch}], val_loss: {tot_loss / n:.4f}, val_acc: {tot_correct / n:.4f}")
    return history


def plot_history(history, steps_per_epoch, path="curves.png"):
    train_losses = [float(x) for x in history["loss"]]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4))
    axes[0].plot(train_losses, alpha=0.4, label="train (per batch)")
    axes[0].plot([(i + 1) * steps_per_epoch for i in range(len(history["val_loss"]))],
                 history["val_loss"], "o-", label="val")
    axes[0].set_xlabel("step")
    axes[0].legend()
    axes[1].plot(history["val_acc"], "x-")
    axes[1].set_xlabel("epoch")
    axes[1].set_title("val accuracy")
    fig.savefig(path, bbox_inches="tight")


class ResNet9(nn.Module):
    def __init__(self, in_ch=3, n_cls=10):
        super().__init__()

        def block(i, o, pool=False):
            layers = [nn.Conv2d(i, o, 3, padding=1), nn.BatchNorm2d(o), nn.ReLU(inplace=True)]
            return nn.Sequential(*layers, nn.MaxPool2d(2)) if pool else nn.Sequential(*layers)

        self.conv1, self.conv2 = block(in_ch, 64), block(64, 128, pool=True)
        self.res1 = nn.Sequential(block(128, 128), block(128, 128))
        self.conv3, self.conv4 = block(128, 256, pool=True), block(256, 512, pool=True)
        self.res2 = nn.Sequential(block(512, 512), block(512, 512))
        self.head = nn.Sequential(nn.AdaptiveMaxPool2d(1), nn.Flatten(), nn.Linear(512, n_cls))

    def forward(self, x):
        out = self.conv2(self.conv1(x))
        out = self.res1(out) + out
        out = self.conv4(self.conv3(out))
        out = self.res2(out) + out
        return self.head(out)
