"""The fact behind OOM303's default level, measured: an evaluation loop with
autograd on whose `output`/`loss` outlives the iteration needs more memory than
the training step it follows; one whose graph dies within the iteration does not.

    python bench/eval_graph_peak.py [--batch 16] [--size 64] [--blocks 8]

It counts the bytes of the tensors that are alive (each new storage an op
returns, until it is freed) during three batches of: a training step (forward,
backward, Adam step), evaluation with autograd on keeping `out` and `loss` until
the next iteration rebinds them (`out = model(x); loss = crit(out, y)`),
evaluation with autograd on freeing the graph within the statement
(`total += crit(model(x), y).item()`), and evaluation under
`torch.inference_mode()`. Parameters, gradients and Adam's state exist before
the count starts (one warm training step), as after an epoch, so the figures are
what each loop adds. CPU, a small convolutional network, random data; the
ratios, not the sizes, are the point.
"""

from __future__ import annotations

import argparse
import gc
import weakref

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

LOOPS = ("train", "eval_kept", "eval_inline", "eval_inference_mode")


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages created under the mode and still alive; the peak."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or key in self._seen:
                continue  # a view, or an in-place result: no new memory
            self._seen.add(key)
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(storage, self._freed, key, size)
        return out

    def _freed(self, key: int, size: int) -> None:
        self.live -= size
        self._seen.discard(key)


def _model(blocks: int) -> nn.Module:
    layers = [nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU()) for _ in range(blocks)]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))


def peak_bytes(loop: str, *, batch: int = 16, size: int = 64, blocks: int = 8) -> int:
    """The peak of the bytes `loop` adds over three batches."""
    torch.manual_seed(0)
    batches = [(torch.randn(batch, 64, size, size), torch.randint(0, 10, (batch,))) for _ in range(3)]
    model = _model(blocks)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters())
    x, y = batches[0]
    criterion(model(x), y).backward()
    optimizer.step()
    gc.collect()
    counter = LiveBytes()
    with counter:
        if loop == "train":
            for x, y in batches:
                optimizer.zero_grad(set_to_none=False)
                loss = criterion(model(x), y)
                loss.backward()
                optimizer.step()
        else:
            model.eval()
            total = 0.0
            for x, y in batches:
                if loop == "eval_kept":
                    out = model(x)
                    loss = criterion(out, y)
                    total += loss.item()
                elif loop == "eval_inline":
                    total += criterion(model(x), y).item()
                else:
                    with torch.inference_mode():
                        out = model(x)
                        loss = criterion(out, y)
                        total += loss.item()
    return counter.peak


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--blocks", type=int, default=8)
    args = parser.parse_args()
    peaks = {loop: peak_bytes(loop, batch=args.batch, size=args.size, blocks=args.blocks) for loop in LOOPS}
    train = peaks["train"]
    print(f"{'loop':22s} {'peak added':>12s} {'vs training':>12s}")
    for loop, peak in peaks.items():
        print(f"{loop:22s} {peak / 2**20:9.1f} MiB {peak / train:11.2f}x")


if __name__ == "__main__":
    main()
