"""The ranks all_reduce tensors of different shapes (a per-rank metric vector of the wrong length)."""

import torch
import torch.distributed as dist
from _common import batch, setup

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    x, y = batch()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 2:
        stats = torch.ones(4 if rank == 0 else 8)  # BUG: shapes differ across ranks
        dist.all_reduce(stats)
dist.destroy_process_group()
