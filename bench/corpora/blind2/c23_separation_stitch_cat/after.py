import argparse
import os
from pathlib import Path

import torch
import torch.nn.functional as F
import torchaudio
from torchaudio.pipelines import HDEMUCS_HIGH_MUSDB_PLUS


def separate_file(model, wav, sample_rate, device, segment_s=10.0, overlap_s=0.5):
    """Run the separator chunk by chunk with linear cross-fades between chunks."""
    channels, length = wav.shape
    seg = int(segment_s * sample_rate)
    ovl = int(overlap_s * sample_rate)
    step = seg - ovl
    fade_in = torch.linspace(0.0, 1.0, ovl)
    fade_out = 1.0 - fade_in
    ref = wav.mean(0)
    wav = (wav - ref.mean()) / ref.std()

    pieces = []
    tail = None
    for start in range(0, length, step):
        chunk = wav[:, start:start + seg]
        pad = seg - chunk.shape[-1]
        with torch.inference_mode():
            out = model(F.pad(chunk, (0, pad)).unsqueeze(0).to(device))[0].cpu()
        out = out[..., : seg - pad]
        if tail is not None:
            n = min(ovl, out.shape[-1])
            out[..., :n] = out[..., :n] * fade_in[:n] + tail[..., :n] * fade_out[:n]
        keep = out[..., :step] if start + seg < length else out
        pieces.append(keep)
        tail = out[..., step:]
    separated = torch.cat(pieces, dim=-1)
    return separated * ref.std() + ref.mean()


def main():
    parser = argparse.ArgumentParser(description="Batch source separation of long recordings")
    parser.add_argument("--in_dir", default="/archive/live_sets")
    parser.add_argument("--out_dir", default="/archive/stems")
    parser.add_argument("--segment", type=float, default=10.0)
    args = parser.parse_args()

    device = torch.device("cuda")
    bundle = HDEMUCS_HIGH_MUSDB_PLUS
    model = bundle.get_model().to(device).eval()
    sources = model.sources

    for path in sorted(Path(args.in_dir).glob("*.flac")):
        wav, sr = torchaudio.load(str(path))
        if sr != bundle.sample_rate:
            wav = torchaudio.functional.resample(wav, sr, bundle.sample_rate)
        stems = separate_file(model, wav, bundle.sample_rate, device, segment_s=args.segment)
        target = Path(args.out_dir) / path.stem
        os.makedirs(target, exist_ok=True)
        for name, stem in zip(sources, stems):
            torchaudio.save(str(target / f"{name}.flac"), stem, bundle.sample_rate)
        print(f"{path.name}: {wav.shape[-1] / bundle.sample_rate / 60:.1f} min -> {len(sources)} stems")


if __name__ == "__main__":
    main()
