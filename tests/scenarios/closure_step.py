"""Plain DDP whose optimizer steps with a closure (forward and backward inside `optimizer.step(closure)`, as
Lightning and LBFGS users do); `--skew-rank R` adds noise to that rank's gradients after DDP reduced them."""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--skew-rank", type=int, default=-1)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 1, generator=g)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            if rank == args.skew_rank:
                for p in model.parameters():
                    p.grad.add_(torch.randn_like(p.grad))
            return loss

        opt.step(closure)
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
