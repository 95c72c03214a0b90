"""In the spirit of pytorch/examples' distributed/ddp-tutorial-series/multigpu.py, edited only to run on CPU/gloo:
the script starts its own ranks with torch.multiprocessing.spawn."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def ddp_setup(rank: int, world_size: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "12355")  # as in the example; the tests only read this file
    dist.init_process_group(backend="gloo", rank=rank, world_size=world_size)


def main(rank: int, world_size: int, total_epochs: int) -> None:
    ddp_setup(rank, world_size)
    model = DDP(nn.Linear(20, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    for _ in range(total_epochs):
        opt.zero_grad()
        model(torch.randn(32, 20)).sum().backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = 2
    mp.spawn(main, args=(world_size, int(sys.argv[1]) if len(sys.argv) > 1 else 2), nprocs=world_size)
