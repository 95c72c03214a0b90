"""One training iteration (like pytorch/examples' ddp/example.py): shorter than any default profile window."""

import torch
import torch.distributed as dist
from _common import batch, setup

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = batch()
torch.nn.functional.cross_entropy(model(x), y).backward()
opt.step()
dist.destroy_process_group()
