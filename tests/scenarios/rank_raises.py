"""Rank 1 raises an exception at step 3; rank 0 then fails with "Connection closed by peer" (a victim)."""

import torch
import torch.distributed as dist
from _common import batch, setup

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(20):
    x, y = batch()
    if rank == 1 and step == 3:
        raise ValueError("corrupt sample in shard 7")
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
