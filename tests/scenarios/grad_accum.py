"""Gradient accumulation as nanoGPT does it: 4 micro-steps per iteration, the first 3 under no_sync, and a data fetch
that calls .item() between them (as a sampler or a length check would). Healthy: nothing above info."""

import contextlib

import torch
import torch.distributed as dist
from _common import batch, setup

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
MICRO = 4


def fetch():
    x, y = batch()
    n = int(y.sum().item())  # a synchronising call in the data path, not in backward
    return x, y, n


for _ in range(30):
    for micro in range(MICRO):
        x, y, _n = fetch()
        ctx = model.no_sync() if micro < MICRO - 1 else contextlib.nullcontext()
        with ctx:
            loss = torch.nn.functional.cross_entropy(model(x), y) / MICRO
            loss.backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
