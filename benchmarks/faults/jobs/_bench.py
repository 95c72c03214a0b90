"""What every benchmark job shares: a tiny DDP model on gloo, the fault's rank and step from the environment, and
the fault mark: the moment a job injects its fault it writes the time (wall clock, this host) to
$FAULT_MARK_DIR/fault-rankR.json, which the runner reads as the start of the time to verdict."""

import datetime
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

FAULT = os.environ.get("FAULT", "none")
FAULT_RANK = int(os.environ.get("FAULT_RANK", "1"))
FAULT_STEP = int(os.environ.get("FAULT_STEP", "5"))
STEPS = int(os.environ.get("STEPS", "12"))


def setup(**ddp_kwargs):
    # A long gloo timeout by default: the tool, not gloo, must find a hang. A scenario that wants gloo to time out
    # (the peers' runs, exception-then-timeout) sets SCENARIO_GLOO_TIMEOUT.
    timeout = int(os.environ.get("SCENARIO_GLOO_TIMEOUT", "300"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    return dist.get_rank(), dist.get_world_size(), DDP(model, **ddp_kwargs)


def batch(n=8):
    return torch.randn(n, 16), torch.randint(0, 4, (n,))


def mark(what):
    """Record that this rank injects its fault now (first call only)."""
    d = os.environ.get("FAULT_MARK_DIR")
    if not d:
        return
    path = os.path.join(d, f"fault-rank{dist.get_rank() if dist.is_initialized() else -1}.json")
    if not os.path.exists(path):
        with open(path + ".tmp", "w") as f:
            json.dump({"t": time.time(), "what": what, "pid": os.getpid()}, f)
        os.replace(path + ".tmp", path)


def is_fault_rank(rank):
    return rank == FAULT_RANK


def train_step(model, opt, x=None, y=None):
    if x is None:
        x, y = batch()
    loss = nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss
