"""Average the last N epoch checkpoints of a Transformer-big NMT run and score the result."""
import argparse
import glob
import os
import re

import sacrebleu
import torch
import torch.nn as nn


class Seq2SeqTransformer(nn.Module):
    def __init__(self, vocab, d_model=1024, heads=16, layers=6, ffn=4096, dropout=0.3):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model, padding_idx=1)
        self.pos = nn.Embedding(1024, d_model)
        self.transformer = nn.Transformer(d_model, heads, layers, layers, ffn, dropout, batch_first=True, norm_first=True)
        self.out = nn.Linear(d_model, vocab, bias=False)
        self.out.weight = self.embed.weight
        self.scale = d_model ** 0.5

    def _emb(self, x):
        return self.embed(x) * self.scale + self.pos(torch.arange(x.size(1), device=x.device))

    @torch.no_grad()
    def greedy(self, src, bos=0, eos=2, max_len=256):
        memory = self.transformer.encoder(self._emb(src), src_key_padding_mask=src.eq(1))
        ys = torch.full((src.size(0), max_len + 1), 1, dtype=torch.long, device=src.device)
        ys[:, 0] = bos
        for t in range(max_len):
            mask = self.transformer.generate_square_subsequent_mask(t + 1, device=src.device)
            h = self.transformer.decoder(self._emb(ys[:, :t + 1]), memory, tgt_mask=mask,
                                         memory_key_padding_mask=src.eq(1))
            ys[:, t + 1] = self.out(h[:, -1]).argmax(-1)
            if ys[:, 1:t + 2].eq(eos).any(1).all():
                return ys[:, :t + 2]
        return ys


def last_n_checkpoints(ckpt_dir, n):
    paths = glob.glob(os.path.join(ckpt_dir, "checkpoint[0-9]*.pt"))
    paths.sort(key=lambda p: int(re.search(r"checkpoint(\d+)\.pt", p).group(1)))
    return paths[-n:]


def average(paths):
    avg, count = None, 0
    for path in paths:
        state = torch.load(path, map_location="cpu")
        params = state["model"]
        if avg is None:
            avg = {k: v.clone().double() for k, v in params.items()}
        else:
            for k, v in params.items():
                avg[k] += v.double()
        count += 1
        print(f"added {os.path.basename(path)}")
    return {k: (v / count).float() for k, v in avg.items()}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--ckpt_dir", default="checkpoints/wmt16_en_de_big")
    parser.add_argument("--num_epoch_checkpoints", type=int, default=10)
    parser.add_argument("--vocab_size", type=int, default=32768)
    parser.add_argument("--test_src", default="data/wmt16_en_de/newstest2014.spm.en.ids")
    parser.add_argument("--test_ref", default="data/wmt16_en_de/newstest2014.de")
    parser.add_argument("--spm", default="data/wmt16_en_de/spm.model")
    args = parser.parse_args()

    import sentencepiece as spm
    sp = spm.SentencePieceProcessor(model_file=args.spm)
    device = torch.device("cuda")
    model = Seq2SeqTransformer(args.vocab_size).to(device).eval()
    averaged = average(last_n_checkpoints(args.ckpt_dir, args.num_epoch_checkpoints))
    model.load_state_dict(averaged)
    torch.save({"model": averaged}, os.path.join(args.ckpt_dir, "checkpoint_avg_last10.pt"))

    hyps = []
    lines = [list(map(int, l.split())) for l in open(args.test_src)]
    for i in range(0, len(lines), 64):
        batch = nn.utils.rnn.pad_sequence([torch.tensor(l) for l in lines[i:i + 64]], batch_first=True, padding_value=1)
        out = model.greedy(batch.to(device))
        hyps.extend(sp.decode([[t for t in row[1:] if t > 2] for row in out.tolist()]))
    refs = [l.rstrip("\n") for l in open(args.test_ref)]
    print(sacrebleu.corpus_bleu(hyps, [refs]))


if __name__ == "__main__":
    main()
