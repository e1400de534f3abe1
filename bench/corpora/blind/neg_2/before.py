import json

import torch
import torch.nn.functional as F
from PIL import Image
from torchvision import transforms


class Predictor:
    """Serving wrapper used by the REST endpoint and the batch scoring job."""

    def __init__(self, checkpoint, labels_path, device=None):
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        bundle = torch.load(checkpoint, map_location="cpu")
        self.net = bundle["arch"]
        self.net.load_state_dict(bundle["state_dict"])
        self.net.to(self.device).eval()
        with open(labels_path) as f:
            self.labels = json.load(f)
        self.tf = transforms.Compose([
            transforms.Resize(256),
            transforms.CenterCrop(224),
            transforms.ToTensor(),
            transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
        ])

    def preprocess(self, paths):
        return torch.stack([self.tf(Image.open(p).convert("RGB")) for p in paths])

    @torch.inference_mode()
    def predict_batch(self, images, topk=5):
        logits = self.net(images.to(self.device, non_blocking=True))
        probs = F.softmax(logits, dim=-1)
        scores, idx = probs.topk(topk, dim=-1)
        return scores.cpu(), idx.cpu()

    def predict_paths(self, paths, batch_size=64, topk=5):
        results = []
        for start in range(0, len(paths), batch_size):
            chunk = paths[start:start + batch_size]
            scores, idx = self.predict_batch(self.preprocess(chunk), topk=topk)
            for p, s, i in zip(chunk, scores.tolist(), idx.tolist()):
                results.append({"path": p, "top": [{"label": self.labels[str(c)], "score": round(v, 4)}
                                                   for v, c in zip(s, i)]})
        return results


def main():
    import argparse
    import glob

    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--labels", default="imagenet_labels.json")
    ap.add_argument("--glob", default="images/*.jpg")
    ap.add_argument("--out", default="predictions.jsonl")
    args = ap.parse_args()
    predictor = Predictor(args.ckpt, args.labels)
    paths = sorted(glob.glob(args.glob))
    with open(args.out, "w") as f:
        for row in predictor.predict_paths(paths):
            f.write(json.dumps(row) + "\n")
    print(f"wrote {len(paths)} predictions to {args.out}")


if __name__ == "__main__":
    main()
