"""A DDP loop with two optimizers (encoder: AdamW, head: SGD) stepping once each per iteration."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 4))
    model = DDP(net)
    opt_body = torch.optim.AdamW(net[0].parameters(), lr=1e-3)
    opt_head = torch.optim.SGD(net[2].parameters(), lr=1e-2)
    for _ in range(args.steps):
        loss = model(torch.randn(16, 32)).pow(2).mean()
        opt_body.zero_grad()
        opt_head.zero_grad()
        loss.backward()
        opt_body.step()
        opt_head.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
