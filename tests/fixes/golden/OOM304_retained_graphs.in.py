import torch
import torch.nn.functional as F


def train(model, loader, optimizer, scaler):
    for images, masks in loader:
        optimizer.zero_grad()
        logits = model(images)
        loss = F.binary_cross_entropy_with_logits(logits, masks)
        # Kept from a debugging session.
        scaler.scale(loss).backward(retain_graph=True)
        scaler.step(optimizer)
        scaler.update()


def train_two_losses(model, loader, optimizer):
    for images, masks in loader:
        logits = model(images)
        bce = F.binary_cross_entropy_with_logits(logits, masks)
        dice = dice_loss(logits, masks)
        optimizer.zero_grad()
        bce.backward(retain_graph=True)
        dice.backward()
        optimizer.step()


def train_gan(netG, netD, loader, criterion, optD, optG, noise):
    for real in loader:
        fake = netG(noise)
        errD_fake = criterion(netD(fake), torch.zeros(len(real)))
        errD_fake.backward(retain_graph=True)
        optD.step()
        errG = criterion(netD(fake), torch.ones(len(real)))
        errG.backward()
        optG.step()
