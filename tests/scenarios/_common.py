"""What every hang scenario shares: a tiny DDP model on gloo with a long gloo timeout (ddpdoctor, not gloo, must
detect the hang), and a loop the scenarios bend."""

import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(**ddp_kwargs):
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=int(os.environ.get("SCENARIO_GLOO_TIMEOUT", "120"))))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    return dist.get_rank(), DDP(model, **ddp_kwargs)


def batch():
    return torch.randn(8, 16), torch.randint(0, 4, (8,))
