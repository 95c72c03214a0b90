"""A DDP loop with no optimizer (a hand-written SGD update) that marks iterations with ddpdoctor.step().

ddpdoctor.step() is a no-op when the script does not run under ddpdoctor."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddpdoctor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--use-context", action="store_true", help="use `with ddpdoctor.iteration():` instead")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)))

    def one_iteration() -> None:
        loss = model(torch.randn(16, 32)).pow(2).mean()
        model.zero_grad(set_to_none=True)
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.01 * p.grad

    for _ in range(args.steps):
        if args.use_context:
            with ddpdoctor.iteration():
                one_iteration()
        else:
            one_iteration()
            ddpdoctor.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
