"""A DDP script that never calls an optimizer step nor ddpdoctor.step()."""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
model = DDP(nn.Linear(8, 2))
for _ in range(6):
    model(torch.randn(4, 8)).sum().backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.01 * p.grad
dist.destroy_process_group()
