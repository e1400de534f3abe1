import torch
import torch.nn.functional as F
import wandb


class Callback:
    def on_train_begin(self, trainer):
        pass

    def on_epoch_end(self, trainer, epoch):
        pass


class ImagePredictionLogger(Callback):
    """Logs predictions on a fixed validation batch to W&B at the end of every epoch."""

    def __init__(self, val_samples, class_names, num_samples=32):
        imgs, labels = val_samples
        self.val_imgs = imgs[:num_samples]
        self.val_labels = labels[:num_samples]
        self.class_names = class_names

    def on_epoch_end(self, trainer, epoch):
        model = trainer.model
        model.eval()
        imgs = self.val_imgs.to(trainer.device)
        with torch.no_grad():
            logits = model(imgs)
        preds = logits.argmax(dim=-1).cpu()
        table = [
            wandb.Image(x, caption=f"pred: {self.class_names[p]}, label: {self.class_names[y]}")
            for x, p, y in zip(self.val_imgs, preds.tolist(), self.val_labels.tolist())
        ]
        wandb.log({"examples": table, "epoch": epoch})
        model.train()


class CheckpointSaver(Callback):
    def __init__(self, path):
        self.path = path

    def on_epoch_end(self, trainer, epoch):
        torch.save(trainer.model.state_dict(), self.path.format(epoch=epoch))


class SimpleTrainer:
    def __init__(self, model, optimizer, loader, device, callbacks=()):
        self.model = model.to(device)
        self.optimizer = optimizer
        self.loader = loader
        self.device = device
        self.callbacks = list(callbacks)

    def _emit(self, name, *args):
        for cb in self.callbacks:
            getattr(cb, name)(self, *args)

    def train(self, epochs):
        self._emit("on_train_begin")
        for epoch in range(epochs):
            self.model.train()
            seen, running = 0, 0.0
            for x, y in self.loader:
                x, y = x.to(self.device), y.to(self.device)
                loss = F.cross_entropy(self.model(x), y, label_smoothing=0.1)
                self.optimizer.zero_grad()
                loss.backward()
                self.optimizer.step()
                running += loss.item() * x.size(0)
                seen += x.size(0)
            wandb.log({"train_loss": running / seen, "epoch": epoch})
            self._emit("on_epoch_end", epoch)


def run(model, train_loader, val_batch, class_names, epochs=20):
    wandb.init(project="cifar-callbacks")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
    trainer = SimpleTrainer(model, opt, train_loader, device, callbacks=[
        ImagePredictionLogger(val_batch, class_names),
        CheckpointSaver("ckpt_{epoch:03d}.pt"),
    ])
    trainer.train(epochs)
