import argparse

import lightning.pytorch as pl
import pandas as pd
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset
from torchmetrics.regression import SpearmanCorrCoef


class VariantEffectDataset(Dataset):
    """Per-variant ESM-2 embeddings paired with measured stability change (ddG)."""

    def __init__(self, csv_path, emb_path):
        self.df = pd.read_csv(csv_path)
        self.emb = torch.load(emb_path, map_location="cpu", mmap=True)

    def __len__(self):
        return len(self.df)

    def __getitem__(self, i):
        row = self.df.iloc[i]
        return {"x": self.emb[int(row.emb_index)].float(), "y": torch.tensor(row.ddg, dtype=torch.float32)}


class LitStability(pl.LightningModule):
    def __init__(self, in_dim=1280, hidden=512, lr=3e-4):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.LayerNorm(in_dim), nn.Linear(in_dim, hidden), nn.GELU(),
                                 nn.Dropout(0.1), nn.Linear(hidden, hidden), nn.GELU(), nn.Linear(hidden, 1))
        self.train_spearman = SpearmanCorrCoef()
        self.val_spearman = SpearmanCorrCoef()

    def forward(self, x):
        return self.net(x).squeeze(-1)

    def training_step(self, batch, batch_idx):
        pred = self(batch["x"])
        loss = F.smooth_l1_loss(pred, batch["y"])
        self.train_spearman.update(pred.detach(), batch["y"])
        self.log("train/loss", loss, prog_bar=True)
        return loss

    def on_train_epoch_end(self):
        self.log("train/spearman", self.train_spearman.compute())
        self.train_spearman.reset()

    def validation_step(self, batch, batch_idx):
        pred = self(batch["x"])
        self.val_spearman(pred, batch["y"])
        self.log("val/loss", F.smooth_l1_loss(pred, batch["y"]), on_epoch=True)
        self.log("val/spearman", self.val_spearman, on_epoch=True, prog_bar=True)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=0.05)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.trainer.max_epochs)
        return [opt], [sched]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--train_csv", default="data/mega_scale/train.csv")
    parser.add_argument("--val_csv", default="data/mega_scale/val.csv")
    parser.add_argument("--emb", default="data/mega_scale/esm2_t33_650M_mean.pt")
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument("--max_epochs", type=int, default=200)
    args = parser.parse_args()

    train_dl = DataLoader(VariantEffectDataset(args.train_csv, args.emb), batch_size=args.batch_size,
                          shuffle=True, num_workers=8)
    val_dl = DataLoader(VariantEffectDataset(args.val_csv, args.emb), batch_size=1024, num_workers=8)
    trainer = pl.Trainer(max_epochs=args.max_epochs, accelerator="gpu", devices=1, precision="bf16-mixed",
                         callbacks=[pl.callbacks.ModelCheckpoint(monitor="val/spearman", mode="max")])
    trainer.fit(LitStability(), train_dl, val_dl)


if __name__ == "__main__":
    main()
