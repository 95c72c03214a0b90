"""Rank 1 raises in iteration 4 (inside the profiler's active window); rank 0 is a victim of the crash."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    if dist.get_rank() == 1 and step == 4:
        raise RuntimeError("boom: rank 1 failed on purpose in iteration 4")
    loss = model(torch.randn(8, 16)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
