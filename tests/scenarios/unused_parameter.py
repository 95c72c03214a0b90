"""A parameter that never gets a gradient (head.aux is never used) with find_unused_parameters=False."""

import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(16, 32)
        self.aux = nn.Linear(32, 4)  # BUG: never used in forward
        self.out = nn.Linear(32, 4)

    def forward(self, x):
        return self.out(torch.relu(self.body(x)))


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=int(os.environ.get("SCENARIO_GLOO_TIMEOUT", "120"))))
model = DDP(Net())
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(10):
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
