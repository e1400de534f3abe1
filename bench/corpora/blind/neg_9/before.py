import lightning.pytorch as pl
import torch
import torch.nn as nn
import torch.nn.functional as F
import torchmetrics
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint


class LitAudioClassifier(pl.LightningModule):
    def __init__(self, n_mels=64, n_classes=35, lr=1e-3):
        super().__init__()
        self.save_hyperparameters()
        self.encoder = nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(64, 128, 3, padding=1), nn.BatchNorm2d(128), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        )
        self.head = nn.Linear(128, n_classes)
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=n_classes)
        self.test_acc = torchmetrics.Accuracy(task="multiclass", num_classes=n_classes)

    def forward(self, mel):
        return self.head(self.encoder(mel.unsqueeze(1)))

    def training_step(self, batch, batch_idx):
        mel, y = batch
        loss = F.cross_entropy(self(mel), y, label_smoothing=0.05)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        mel, y = batch
        logits = self(mel)
        self.val_acc(logits, y)
        self.log("val_loss", F.cross_entropy(logits, y), prog_bar=True)
        self.log("val_acc", self.val_acc, prog_bar=True)

    def test_step(self, batch, batch_idx):
        mel, y = batch
        logits = self(mel)
        self.test_acc(logits, y)
        self.log("test_acc", self.test_acc)

    def predict_step(self, batch, batch_idx, dataloader_idx=0):
        mel, _ = batch
        return self(mel).softmax(-1)

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=1e-2)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=self.trainer.max_epochs)
        return {"optimizer": opt, "lr_scheduler": sched}


def main(datamodule):
    model = LitAudioClassifier()
    trainer = pl.Trainer(
        max_epochs=40,
        accelerator="auto",
        precision="16-mixed",
        callbacks=[ModelCheckpoint(monitor="val_acc", mode="max"), EarlyStopping(monitor="val_loss", patience=5)],
    )
    trainer.fit(model, datamodule=datamodule)
    trainer.test(model, datamodule=datamodule, ckpt_path="best")
    probs = torch.cat(trainer.predict(model, datamodule=datamodule, ckpt_path="best"))
    torch.save(probs, "test_probs.pt")
