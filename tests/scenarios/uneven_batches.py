"""Rank 0 gets fewer batches than rank 1, then waits at the end-of-epoch barrier."""

import torch
import torch.distributed as dist
from _common import batch, setup

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
batches = [batch() for _ in range(4 if rank == 0 else 6)]  # BUG: uneven shards
for x, y in batches:
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.barrier()
dist.destroy_process_group()
