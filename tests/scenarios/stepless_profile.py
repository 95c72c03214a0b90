"""The PyTorch profiler used the way its recipe's first example does: `with torch.profiler.profile(...) as prof:`
around some training iterations, no schedule and no `prof.step()`, then `export_chrome_trace`. The trace holds no
ProfilerStep, as traces from serving and RL frameworks do. A DDP MLP on gloo under plain torchrun (no ddpdoctor);
each rank writes OUT/rank{R}.pt.trace.json."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.profiler import ProfilerActivity, profile


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--iters", type=int, default=8)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 8)),
                bucket_cap_mb=0.1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(32, 64), torch.randint(0, 8, (32,))
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.iters):
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    os.makedirs(args.out, exist_ok=True)
    prof.export_chrome_trace(os.path.join(args.out, f"rank{rank}.pt.trace.json"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
