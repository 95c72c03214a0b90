"""A DDP loop with torch.amp.GradScaler; one step's gradients are made infinite so the scaler skips that step.

ddpdoctor must still count the skipped step as one training iteration."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--skip-step", type=int, default=4, help="iteration whose step the scaler skips")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 4)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    skipped = 0
    for step in range(args.steps):
        x = torch.randn(16, 32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(x).float().pow(2).mean()
        if step == args.skip_step:
            loss = loss * float("inf")  # inf gradients: GradScaler.step() skips optimizer.step()
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scale_before = scaler.get_scale()
        scaler.step(opt)
        scaler.update()
        skipped += scaler.get_scale() < scale_before
    if dist.get_rank() == 0:
        print(f"skipped steps: {skipped}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
