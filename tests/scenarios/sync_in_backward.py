"""Scenario: a DDP MLP whose gradient hooks call .item() (a host sync inside backward), built with
find_unused_parameters=True although every parameter gets a gradient, fed by a DataLoader that takes 20 ms per
batch: for sync-in-backward, find-unused-parameters-unneeded and data-loading-wait.

    ddpdoctor profile --nproc-per-node 2 tests/scenarios/sync_in_backward.py
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class SlowBatches(Dataset):
    """Each batch takes ``delay`` seconds to produce (decoding or slow storage, in the main process)."""

    def __init__(self, n: int, delay: float) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        time.sleep(self.delay)
        return torch.randn(32, 64), torch.randint(0, 10, (32,))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=7)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--data-delay", type=float, default=0.02)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, args.width), nn.ReLU(), nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, 10))
    norms: list[float] = []
    for p in model.parameters():
        # The anti-pattern: reading a gradient statistic on the host while backward is still running.
        p.register_hook(lambda g: norms.append(g.norm().item()) or g)
    ddp = DDP(model, bucket_cap_mb=1, find_unused_parameters=True)  # every parameter is used: not needed
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    loader = DataLoader(SlowBatches(args.steps, args.data_delay), batch_size=None)
    for x, y in loader:
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
