import argparse

import editdistance
import torch
import torchaudio
from torch.utils.data import DataLoader

from torchaudio.models import Conformer

VOCAB = ["<blank>", " ", "'"] + [chr(c) for c in range(ord("a"), ord("z") + 1)]


class ConformerCTC(torch.nn.Module):
    def __init__(self, n_mels=80, d_model=512, layers=17, heads=8, ffn=2048):
        super().__init__()
        self.subsample = torch.nn.Sequential(
            torch.nn.Conv2d(1, d_model, 3, stride=2), torch.nn.ReLU(),
            torch.nn.Conv2d(d_model, d_model, 3, stride=2), torch.nn.ReLU())
        self.proj = torch.nn.Linear(d_model * (((n_mels - 1) // 2 - 1) // 2), d_model)
        self.encoder = Conformer(d_model, heads, ffn, layers, depthwise_conv_kernel_size=31, dropout=0.1)
        self.ctc = torch.nn.Linear(d_model, len(VOCAB))

    def forward(self, feats, lengths):
        x = self.subsample(feats.unsqueeze(1))
        b, c, t, f = x.shape
        x = self.proj(x.permute(0, 2, 1, 3).reshape(b, t, c * f))
        lengths = ((lengths - 1) // 2 - 1) // 2
        x, lengths = self.encoder(x, lengths.clamp(max=t))
        return self.ctc(x).log_softmax(-1), lengths


def greedy_decode(log_probs, lengths):
    hyps = []
    for lp, n in zip(log_probs, lengths.tolist()):
        ids = lp[:n].argmax(-1).unique_consecutive().tolist()
        hyps.append("".join(VOCAB[i] for i in ids if i != 0))
    return hyps


def collate(batch, fbank=torchaudio.transforms.MelSpectrogram(16000, n_fft=400, hop_length=160, n_mels=80)):
    feats = [fbank(wav[0]).clamp(min=1e-10).log().t() for wav, *_ in batch]
    lengths = torch.tensor([f.size(0) for f in feats])
    texts = [item[2].lower() for item in batch]
    return torch.nn.utils.rnn.pad_sequence(feats, batch_first=True), lengths, texts


def main():
    parser = argparse.ArgumentParser(description="WER evaluation of a Conformer-CTC checkpoint")
    parser.add_argument("--ckpt", default="exp/conformer_large_ctc/epoch-120.pt")
    parser.add_argument("--root", default="/datasets")
    parser.add_argument("--split", default="test-other")
    parser.add_argument("--use_ema", action="store_true")
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()

    device = torch.device("cpu" if args.cpu else "cuda")
    ckpt = torch.load(args.ckpt, map_location="cpu")
    model = ConformerCTC().to(device)
    model.load_state_dict(ckpt["ema"] if args.use_ema else ckpt["model"])
    model.eval()

    dataset = torchaudio.datasets.LIBRISPEECH(args.root, url=args.split)
    loader = DataLoader(dataset, batch_size=16, collate_fn=collate, num_workers=4)
    errors = words = 0
    with torch.inference_mode():
        for feats, lengths, texts in loader:
            log_probs, out_lens = model(feats.to(device), lengths.to(device))
            for hyp, ref in zip(greedy_decode(log_probs, out_lens), texts):
                errors += editdistance.eval(hyp.split(), ref.split())
                words += len(ref.split())
    print(f"{args.split}: WER {100.0 * errors / words:.2f}% over {words} words")


if __name__ == "__main__":
    main()
