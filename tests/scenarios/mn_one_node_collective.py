"""Multi-node: rank 1 (node 1 of 2x1) calls an extra barrier at step 3 that rank 0 never calls."""

import torch
import torch.distributed as dist
from _common import batch, setup

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(40):
    if rank == 1 and step == 3:
        dist.barrier()  # BUG: a collective under a rank condition
    x, y = batch()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
