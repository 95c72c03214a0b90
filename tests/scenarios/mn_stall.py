"""Multi-node: rank 3 (node 1 of 2x2) blocks forever in its data loading at step 6; ranks 0-2 wait in DDP's all-reduce."""

import os
import time

import torch
from _common import batch, setup

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(40):
    if rank == int(os.environ.get("MN_STUCK_RANK", "3")) and step == 6:
        time.sleep(3600)  # BUG: a read that never returns
    x, y = batch()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
