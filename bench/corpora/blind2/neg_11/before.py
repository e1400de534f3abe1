import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from PIL import Image
from torchvision import transforms
from torchvision.models import vgg19


class ResidualBlock(nn.Module):
    def __init__(self, ch):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(ch, ch, 3, padding=1), nn.InstanceNorm2d(ch, affine=True), nn.ReLU(inplace=True),
            nn.Conv2d(ch, ch, 3, padding=1), nn.InstanceNorm2d(ch, affine=True))

    def forward(self, x):
        return x + self.body(x)


class TransformerNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.down = nn.Sequential(
            nn.Conv2d(3, 32, 9, padding=4), nn.InstanceNorm2d(32, affine=True), nn.ReLU(inplace=True),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.InstanceNorm2d(64, affine=True), nn.ReLU(inplace=True),
            nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.InstanceNorm2d(128, affine=True), nn.ReLU(inplace=True))
        self.res = nn.Sequential(*[ResidualBlock(128) for _ in range(5)])
        self.up = nn.Sequential(
            nn.Upsample(scale_factor=2), nn.Conv2d(128, 64, 3, padding=1), nn.InstanceNorm2d(64, affine=True), nn.ReLU(inplace=True),
            nn.Upsample(scale_factor=2), nn.Conv2d(64, 32, 3, padding=1), nn.InstanceNorm2d(32, affine=True), nn.ReLU(inplace=True),
            nn.Conv2d(32, 3, 9, padding=4))

    def forward(self, x):
        return self.up(self.res(self.down(x)))


def stylize_folder(model, in_dir, out_dir, device, max_side=2048):
    to_tensor = transforms.ToTensor()
    os.makedirs(out_dir, exist_ok=True)
    for name in sorted(os.listdir(in_dir)):
        img = Image.open(os.path.join(in_dir, name)).convert("RGB")
        img.thumbnail((max_side, max_side))
        x = to_tensor(img).unsqueeze(0).to(device) * 255
        with torch.inference_mode():
            y = model(x).clamp(0, 255)[0].byte().permute(1, 2, 0).cpu().numpy()
        Image.fromarray(y).save(os.path.join(out_dir, name))


def main():
    parser = argparse.ArgumentParser(description="Apply a fast neural style model to a folder of photos")
    parser.add_argument("--model", default="saved_models/starry_night_epoch2.pth")
    parser.add_argument("--input", default="photos/")
    parser.add_argument("--output", default="stylized/")
    args = parser.parse_args()

    device = torch.device("cuda")
    state_dict = torch.load(args.model, map_location=lambda storage, loc: storage)
    for k in list(state_dict.keys()):
        if k.endswith(("running_mean", "running_var")):
            del state_dict[k]
    model = TransformerNet()
    model.load_state_dict(state_dict)
    model.to(device).eval()
    stylize_folder(model, args.input, args.output, device)


if __name__ == "__main__":
    main()
