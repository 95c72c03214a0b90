"""A training loop far longer than any profile window: `profile` must return soon after its window, not at the end."""

import time

import torch
import torch.distributed as dist
from _common import batch, setup

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(100_000):  # ~30 minutes at 20 ms per step
    x, y = batch()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.02)
dist.destroy_process_group()
