import copy
import time

import torch
import torch.nn as nn
from torchvision import datasets, models, transforms

data_transforms = {
    "train": transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ]),
    "val": transforms.Compose([
        transforms.Resize(256),
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ]),
}


def fit_one_epoch(classifier, loader, criterion, optimizer, device):
    classifier.train()
    epoch_loss = 0.0
    epoch_corrects = 0
    for inputs, labels in loader:
        inputs, labels = inputs.to(device), labels.to(device)
        optimizer.zero_grad()
        outputs = classifier(inputs)
        loss = criterion(outputs, labels)
        loss.backward()
        optimizer.step()
        epoch_loss = epoch_loss + loss * inputs.size(0)
        epoch_corrects += torch.sum(outputs.argmax(1) == labels).item()
    n = len(loader.dataset)
    return float(epoch_loss) / n, epoch_corrects / n


@torch.no_grad()
def score(classifier, loader, criterion, device):
    classifier.eval()
    total_loss, corrects = 0.0, 0
    for inputs, labels in loader:
        inputs, labels = inputs.to(device), labels.to(device)
        outputs = classifier(inputs)
        total_loss += criterion(outputs, labels).item() * inputs.size(0)
        corrects += (outputs.argmax(1) == labels).sum().item()
    n = len(loader.dataset)
    return total_loss / n, corrects / n


def main(data_dir="data/hymenoptera_data", num_epochs=25):
    image_datasets = {x: datasets.ImageFolder(f"{data_dir}/{x}", data_transforms[x]) for x in ["train", "val"]}
    loaders = {x: torch.utils.data.DataLoader(image_datasets[x], batch_size=4, shuffle=(x == "train"),
                                              num_workers=4) for x in ["train", "val"]}
    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")

    classifier = models.resnet18(weights="IMAGENET1K_V1")
    classifier.fc = nn.Linear(classifier.fc.in_features, len(image_datasets["train"].classes))
    classifier = classifier.to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(classifier.parameters(), lr=0.001, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=7, gamma=0.1)

    since = time.time()
    best_wts, best_acc = copy.deepcopy(classifier.state_dict()), 0.0
    for epoch in range(num_epochs):
        tr_loss, tr_acc = fit_one_epoch(classifier, loaders["train"], criterion, optimizer, device)
        scheduler.step()
        va_loss, va_acc = score(classifier, loaders["val"], criterion, device)
        print(f"Epoch {epoch}/{num_epochs - 1} train {tr_loss:.4f}/{tr_acc:.4f} val {va_loss:.4f}/{va_acc:.4f}")
        if va_acc > best_acc:
            best_acc, best_wts = va_acc, copy.deepcopy(classifier.state_dict())
    print(f"Training complete in {time.time() - since:.0f}s, best val acc {best_acc:.4f}")
    classifier.load_state_dict(best_wts)
    return classifier


if __name__ == "__main__":
    main()
