"""The step of the GPU memory snapshots kkaitlyn111/cs336-a2-systems published (memory_files/,
commit c1c174d), as a runnable fixture for oom-lsp's benchmarks, written from its
cs336_systems/benchmark.py configuration (see PROVENANCE.md).

The configuration recorded: the model (TransformerLM of kkaitlyn111/cs336-assignment1, "2.7b" size:
d_model 2560, d_ff 10240, 32 layers, 32 heads), vocab 10,000, batch 4, theta 10,000, its AdamW
(lr 1e-4, weight decay 0.01, eps 1e-8, betas (0.9, 0.95)), its cross_entropy_loss, a random batch
used as inputs and targets, float32 with TF32 matmuls (`--mixed-precision`: the dtype bfloat16 and
`torch.autocast("cuda", bfloat16)`), and the step: zero_grad, forward, loss, backward, step (or the
forward alone), configured from the command line; the full step runs `--steps` times (default 2:
`oom-lsp estimate` traces two optimizer steps; the published snapshots recorded the first step only).
"""

import argparse
from contextlib import nullcontext

import torch
from cs336_basics.optimizers import AdamW
from cs336_basics.training import cross_entropy_loss
from cs336_basics.transformer import TransformerLM

SIZES = {
    "small": {"d_model": 768, "d_ff": 3072, "num_layers": 12, "num_heads": 12},
    "medium": {"d_model": 1024, "d_ff": 4096, "num_layers": 24, "num_heads": 16},
    "large": {"d_model": 1280, "d_ff": 5120, "num_layers": 36, "num_heads": 20},
    "xl": {"d_model": 1600, "d_ff": 6400, "num_layers": 48, "num_heads": 25},
    "2.7b": {"d_model": 2560, "d_ff": 10240, "num_layers": 32, "num_heads": 32},
}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-size", default="2.7b", choices=sorted(SIZES))
    parser.add_argument("--context-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--vocab-size", type=int, default=10000)
    parser.add_argument("--mixed-precision", action="store_true")
    parser.add_argument("--forward-only", action="store_true")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()

    config = SIZES[args.model_size]
    if args.mixed_precision:
        dtype = torch.bfloat16
    else:
        dtype = torch.float32
        torch.set_float32_matmul_precision("high")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    model = TransformerLM(
        d_model=config["d_model"],
        d_ff=config["d_ff"],
        vocab_size=args.vocab_size,
        context_length=args.context_length,
        num_heads=config["num_heads"],
        num_layers=config["num_layers"],
        theta=10000,
        device=device,
        dtype=dtype,
    )
    model.to(device)
    optimizer = AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, eps=1e-8, betas=(0.9, 0.95))
    loss_fn = cross_entropy_loss

    batch = torch.randint(low=0, high=args.vocab_size, size=(args.batch_size, args.context_length))
    batch = batch.to(device)
    inputs = batch
    targets = batch

    casting = torch.autocast(device_type="cuda", dtype=dtype) if args.mixed_precision else nullcontext()
    with casting:
        if args.forward_only:
            logits = model(inputs)
        else:
            for _ in range(args.steps):
                optimizer.zero_grad()
                logits = model(inputs)
                loss = loss_fn(logits, targets)
                loss.backward()
                optimizer.step()
    print(f"done: {args.model_size}, context {args.context_length}, logits {tuple(logits.shape)}")


if __name__ == "__main__":
    main()
