"""A small DDP job for the live-watch tests: optional slow rank (in forward) from a step on, optional recurring
evaluation, optional run-until-files-appear (for captures on a running job, manual or automatic)."""

import argparse
import glob
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--slow-rank", type=int, default=-1)
p.add_argument("--slow-from", type=int, default=30)
p.add_argument("--slow-s", type=float, default=0.03)
p.add_argument("--eval-every", type=int, default=0)
p.add_argument("--until-file", default=None)
p.add_argument("--until-glob", default=None, help="past --steps, go on until this matches one file per rank")
p.add_argument("--data-s", type=float, default=0.02)
a = p.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(64, 64)
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if rank == a.slow_rank and self.step >= a.slow_from and torch.is_grad_enabled():
            time.sleep(a.slow_s)  # this rank's forward got slower (a throttled host, a noisy neighbour)
        return self.lin(x)


net = Net()
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
step = 0


def go_on(step: int) -> bool:
    """Past --steps, every rank stops on the same iteration: each looks, and one all_reduce(MAX) decides for all
    (a rank that left alone would leave the others in a collective it never enters)."""
    if step < a.steps:
        return True
    if not (a.until_file or a.until_glob) or step >= 5000:
        return False
    seen = (a.until_file is not None and os.path.exists(a.until_file)) or \
        (a.until_glob is not None and len(glob.glob(a.until_glob)) >= dist.get_world_size())
    flag = torch.tensor([int(seen)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return not flag.item()


while go_on(step):
    net.step = step
    x = torch.randn(32, 64)
    time.sleep(a.data_s)  # data loading
    loss = model(x).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if a.eval_every and step and step % a.eval_every == 0:
        with torch.no_grad():  # evaluation: ~0.6 s of forward passes every eval_every steps
            t0 = time.time()
            while time.time() - t0 < 0.6:
                model(x)
                time.sleep(0.01)
    step += 1
dist.destroy_process_group()
