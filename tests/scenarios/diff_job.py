"""A small DDP job for `ddpdoctor diff`: a DataLoader-fed MLP whose data loading can be slowed on one rank and whose
bucket_cap_mb can change, so that two profiles differ in one known way (tests/e2e/test_diff.py)."""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--slow-rank", type=int, default=-1)
parser.add_argument("--data-sleep-ms", type=float, default=0.0)
parser.add_argument("--bucket-cap-mb", type=float, default=25.0)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)


class Batches(Dataset):
    """Each item is one batch; on --slow-rank, fetching it sleeps --data-sleep-ms (a slow disk or decoder)."""

    def __len__(self) -> int:
        return args.steps

    def __getitem__(self, i: int):
        if rank == args.slow_rank and args.data_sleep_ms > 0:
            time.sleep(args.data_sleep_ms / 1000.0)
        g = torch.Generator().manual_seed(i)
        return torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)


model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)),
            bucket_cap_mb=args.bucket_cap_mb)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = DataLoader(Batches(), batch_size=None, num_workers=0)
for x, y in loader:
    opt.zero_grad(set_to_none=True)
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
dist.destroy_process_group()
