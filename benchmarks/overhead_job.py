"""The job overhead.py --command run times: a DDP MLP on gloo that measures its own step times (rank 0 prints them)."""

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--width", type=int, default=512)
parser.add_argument("--layers", type=int, default=6)
args = parser.parse_args()

dist.init_process_group("gloo")
torch.manual_seed(0)
layers: list[nn.Module] = [nn.Linear(64, args.width), nn.ReLU()]
for _ in range(args.layers - 2):
    layers += [nn.Linear(args.width, args.width), nn.ReLU()]
layers.append(nn.Linear(args.width, 10))
model = DDP(nn.Sequential(*layers))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 64), torch.randint(0, 10, (32,))
times = []
for _ in range(args.steps):
    t0 = time.perf_counter()
    opt.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    dist.all_reduce(loss.detach())  # one user collective per step: the wrapped path is measured too
    times.append(time.perf_counter() - t0)
if dist.get_rank() == 0:
    print("STEP_TIMES " + json.dumps(times), flush=True)
dist.destroy_process_group()
