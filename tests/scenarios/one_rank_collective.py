"""Rank 0 alone calls an all_reduce inside the loop (a metric logged on rank 0 only)."""

import torch
import torch.distributed as dist
from _common import batch, setup

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    x, y = batch()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 0 and step == 3:
        dist.all_reduce(loss.detach())  # BUG: only rank 0 calls it
dist.destroy_process_group()
