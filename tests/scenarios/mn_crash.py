"""Multi-node: rank 1 (node 1 of 2x1) raises at step 3 while rank 0 (node 0) waits for it in DDP's all-reduce."""

import torch
from _common import batch, setup

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(40):
    if rank == 1 and step == 3:
        raise ValueError("corrupt sample in shard 17")
    x, y = batch()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
