"""A healthy job whose first step is slow (a cold cache): not a hang."""

import time

import torch
import torch.distributed as dist
from _common import batch, setup

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    x, y = batch()
    if step == 0:
        time.sleep(6)  # compilation / cold cache
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
