"""The PyTorch DDP tutorial's loop (pytorch/examples distributed/ddp-tutorial-series/multigpu_torchrun.py), on CPU/gloo.

Each epoch peeks at one batch with next(iter(loader)) to print the batch size, then calls set_epoch and
iterates. 64 samples, batch 4, 2 ranks: an epoch is 8 steps, longer than check-sync's default --steps 5.
--no-set-epoch leaves set_epoch out (the real bug: every epoch repeats the first one's order)."""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class MyTrainDataset(Dataset):
    def __init__(self, size: int) -> None:
        gen = torch.Generator().manual_seed(0)
        self.data = [(torch.rand(20, generator=gen), torch.rand(1, generator=gen)) for _ in range(size)]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int):
        return self.data[index]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("total_epochs", type=int)
    parser.add_argument("--batch_size", default=4, type=int)
    parser.add_argument("--no-set-epoch", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    dataset = MyTrainDataset(64)
    train_data = DataLoader(dataset, batch_size=args.batch_size, shuffle=False, sampler=DistributedSampler(dataset))
    model = DDP(torch.nn.Linear(20, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for epoch in range(args.total_epochs):
        b_sz = len(next(iter(train_data))[0])
        print(f"[rank{rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(train_data)}", flush=True)
        if not args.no_set_epoch:
            train_data.sampler.set_epoch(epoch)
        for source, targets in train_data:
            optimizer.zero_grad()
            F.mse_loss(model(source), targets).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
