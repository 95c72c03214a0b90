"""Rank 1 gets stuck in its data pipeline (a sample that never loads) while rank 0 waits in DDP's all-reduce."""

import time

import torch
import torch.distributed as dist
from _common import setup
from torch.utils.data import DataLoader, Dataset

rank, model = setup()


class Samples(Dataset):
    def __len__(self):
        return 200

    def __getitem__(self, i):
        if rank == 1 and i == 40:
            time.sleep(3600)  # BUG: a read that never returns
        return torch.randn(16), i % 4


opt = torch.optim.SGD(model.parameters(), lr=0.1)
for x, y in DataLoader(Samples(), batch_size=8):
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
