"""Dump HuBERT layer features for k-means unit discovery."""
import argparse
import os

import numpy as np
import soundfile as sf
import torch
from sklearn.cluster import MiniBatchKMeans
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import DataLoader, Dataset
from transformers import HubertModel


class Manifest(Dataset):
    def __init__(self, tsv):
        with open(tsv) as f:
            self.root = f.readline().strip()
            self.items = [line.strip().split("\t")[0] for line in f]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, idx):
        wav, sr = sf.read(os.path.join(self.root, self.items[idx]), dtype="float32")
        assert sr == 16000
        return torch.from_numpy(wav), self.items[idx]


def collate(batch):
    wavs, ids = zip(*batch)
    lengths = torch.tensor([w.numel() for w in wavs])
    return pad_sequence(wavs, batch_first=True), lengths, list(ids)


@torch.no_grad()
def dump_features(model, loader, layer, device):
    model.eval()
    feats = {}
    for wavs, lengths, utt_ids in loader:
        wavs = wavs.to(device)
        mask = (torch.arange(wavs.size(1))[None, :] < lengths[:, None]).to(device)
        out = model(wavs, attention_mask=mask.long(), output_hidden_states=True)
        hidden = out.hidden_states[layer]
        frames = model._get_feat_extract_output_lengths(lengths).tolist()
        for i, utt_id in enumerate(utt_ids):
            feats[utt_id] = hidden[i, : frames[i]]
    return feats


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--manifest", default="manifests/librispeech_train_clean_100.tsv")
    parser.add_argument("--model", default="facebook/hubert-base-ls960")
    parser.add_argument("--layer", type=int, default=9)
    parser.add_argument("--n_clusters", type=int, default=500)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--out_dir", default="units/hubert_l9_km500")
    args = parser.parse_args()

    device = torch.device("cuda")
    model = HubertModel.from_pretrained(args.model).to(device)
    loader = DataLoader(Manifest(args.manifest), batch_size=args.batch_size, collate_fn=collate, num_workers=6)
    feats = dump_features(model, loader, args.layer, device)

    km = MiniBatchKMeans(n_clusters=args.n_clusters, batch_size=10_000, max_iter=100, n_init=20)
    km.fit(np.concatenate([f.cpu().numpy() for f in feats.values()]))
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "train.km"), "w") as out:
        for utt_id, f in feats.items():
            units = km.predict(f.cpu().numpy())
            out.write(f"{utt_id}\t{' '.join(map(str, units))}\n")


if __name__ == "__main__":
    main()
