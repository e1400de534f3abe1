"""Run a trained checkpoint over the test set and write a Kaggle submission."""
import argparse
import os

import numpy as np
import pandas as pd
import timm
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import transforms


class TestDataset(Dataset):
    def __init__(self, df, img_dir, transform):
        self.df = df.reset_index(drop=True)
        self.img_dir = img_dir
        self.transform = transform

    def __len__(self):
        return len(self.df)

    def __getitem__(self, idx):
        image_id = self.df.loc[idx, "image_id"]
        img = Image.open(os.path.join(self.img_dir, image_id)).convert("RGB")
        return self.transform(img), image_id


def load_model(ckpt_path, model_name, num_classes, device):
    model = timm.create_model(model_name, pretrained=False, num_classes=num_classes)
    state = torch.load(ckpt_path, map_location="cpu")
    if "model" in state:
        state = state["model"]
    state = {k.replace("module.", ""): v for k, v in state.items()}
    model.load_state_dict(state)
    return model.to(device)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--csv", default="../input/sample_submission.csv")
    parser.add_argument("--img-dir", default="../input/test_images")
    parser.add_argument("--ckpt", default="fold0_best.pth")
    parser.add_argument("--model", default="tf_efficientnet_b3_ns")
    parser.add_argument("--num-classes", type=int, default=5)
    parser.add_argument("--img-size", type=int, default=512)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tf = transforms.Compose([
        transforms.Resize((args.img_size, args.img_size)),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ])
    df = pd.read_csv(args.csv)
    loader = DataLoader(TestDataset(df, args.img_dir, tf), batch_size=args.batch_size,
                        shuffle=False, num_workers=4, pin_memory=True)

    model = load_model(args.ckpt, args.model, args.num_classes, device)
    model.eval()

    all_probs, all_ids = [], []
    with torch.no_grad():
        for images, image_ids in loader:
            images = images.to(device)
            probs = F.softmax(model(images), dim=1)
            all_probs.append(probs.detach().cpu().numpy())
            all_ids.extend(image_ids)

    probs = np.concatenate(all_probs)
    sub = pd.DataFrame({"image_id": all_ids, "label": probs.argmax(1)})
    sub.to_csv("submission.csv", index=False)
    np.save("test_probs.npy", probs)
    print(sub.head())


if __name__ == "__main__":
    main()
