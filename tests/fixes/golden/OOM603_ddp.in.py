"""A torchrun script: DDP over the local GPU, options over several lines."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def wrap(model: nn.Module) -> nn.Module:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    return DDP(
        model.cuda(local_rank),
        device_ids=[local_rank],
        bucket_cap_mb=50,  # fewer, larger buckets
    )


def wrap_head(head: nn.Module) -> nn.Module:
    # A deliberate choice: left alone.
    return nn.parallel.DistributedDataParallel(head, gradient_as_bucket_view=False)


if __name__ == "__main__":
    dist.init_process_group("nccl")
    model = wrap(nn.Linear(1024, 1024))
    probe = torch.nn.parallel.DistributedDataParallel(nn.Linear(8, 8).cuda())
