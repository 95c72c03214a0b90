"""One rank does extra work in one phase every step (issue 28): --phase backward (a gradient hook that sleeps),
forward, data (before the batch reaches the model), optimizer (an optimizer pre-step hook), or none (healthy).

--phase starved: every rank does the same work (--work matrix products a step), but the slow rank shares one CPU
with --spinners busy processes of another program (a noisy neighbour on its host): it waits for that CPU, its own
work is no longer than the others'."""

import argparse
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
# Defaults from the environment too: the multi-node tests' launcher helper passes no script arguments.
p.add_argument("--steps", type=int, default=int(os.environ.get("SLOW_STEPS", "60")))
p.add_argument("--slow-rank", type=int, default=int(os.environ.get("SLOW_RANK", "-1")))
p.add_argument("--phase", choices=("backward", "forward", "data", "optimizer", "starved", "none"),
               default=os.environ.get("SLOW_PHASE", "none"))
p.add_argument("--slow-s", type=float, default=0.03)
p.add_argument("--data-s", type=float, default=0.01)
p.add_argument("--spinners", type=int, default=3)
p.add_argument("--work", type=int, default=0, help="256x256 matrix products per step on every rank")
a = p.parse_args()
spinners: list[subprocess.Popen[bytes]] = []
if a.phase == "starved" and int(os.environ["RANK"]) == a.slow_rank:
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})  # before the process group: gloo's threads inherit it
    spin = ("import os, time\nos.sched_setaffinity(0, {%d})\nend = time.time() + 300\n"
            "while time.time() < end and os.getppid() == %d: pass\n") % (cpu, os.getpid())
    spinners = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(a.spinners)]
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
slow = rank == a.slow_rank and a.phase not in ("none", "starved")
m = torch.randn(256, 256)


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(64, 128)
        self.b = torch.nn.Linear(128, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if slow and a.phase == "forward":
            time.sleep(a.slow_s)
        return self.b(torch.relu(self.a(x)))


net = Net()
if slow and a.phase == "backward":
    net.b.weight.register_hook(lambda g: time.sleep(a.slow_s))  # runs inside backward, on this rank only
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
if slow and a.phase == "optimizer":
    opt.register_step_pre_hook(lambda *args: time.sleep(a.slow_s))
for step in range(a.steps):
    time.sleep(a.data_s + (a.slow_s if slow and a.phase == "data" else 0.0))  # loading the batch
    x = torch.randn(32, 64)
    for _ in range(a.work):
        m = torch.tanh(m @ m)  # every rank's same CPU work
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
for sp in spinners:
    sp.kill()
    sp.wait()
