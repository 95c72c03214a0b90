"""A tiny DDP training script with one sync or data bug chosen by --bug (check-sync scenarios, 2 CPU gloo ranks).

    --bug none              correct: DistributedSampler + set_epoch
    --bug bn                correct: BatchNorm with the default broadcast_buffers=True
    --bug bn-no-broadcast   BatchNorm with broadcast_buffers=False (running stats drift)
    --bug no-set-epoch      DistributedSampler(shuffle=True) but set_epoch is never called
    --bug no-sampler        plain DataLoader: every rank sees every sample
    --bug shards            hand-made Subset shards that overlap and leave samples unused
    --bug param-edit        rank 1 edits a weight after DDP wrapped the model
    --bug no-sync           every backward runs under model.no_sync()
    --bug uneven            hand-made shards with 3 batches on rank 0 and 5 on rank 1
    --bug unused            a layer that never takes part in the loss (find_unused_parameters=True)
    --bug stream            an IterableDataset that yields the same stream on every rank (not split by rank)
    --bug random-split      random_split with each rank's own generator, then DistributedSampler (minGPT-ddp)
    --bug shuffle           DataLoader(shuffle=True), no DistributedSampler
    --bug seeds             DistributedSampler(seed=rank)
    --bug uneven-last       hand-made shards of 7 and 9 samples, batch 4: only the last batch is uneven
    --bug no-ddp            the model is never wrapped in DDP (pytorch/examples imagenet's CPU path)
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, Subset, TensorDataset, random_split


class Stream(IterableDataset):
    """Every rank reads the whole stream: the bug is the missing `if i % world == rank` split."""

    def __init__(self, data: TensorDataset) -> None:
        self.data = data

    def __iter__(self):
        return (self.data[i] for i in range(len(self.data)))


class Net(nn.Module):
    def __init__(self, bn: bool, unused: bool) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.bn = nn.BatchNorm1d(16) if bn else nn.Identity()
        self.fc2 = nn.Linear(16, 4)
        self.spare = nn.Linear(16, 4) if unused else None

    def forward(self, x):
        return self.fc2(torch.relu(self.bn(self.fc1(x))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bug", default="none")
    parser.add_argument("--epochs", type=int, default=4)
    args = parser.parse_args()
    bug = args.bug

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    n = 16
    data = TensorDataset(torch.randn(n, 8), torch.randint(0, 4, (n,)))

    model = Net(bn=bug in ("bn", "bn-no-broadcast"), unused=bug == "unused")
    if bug == "no-ddp":
        ddp = model
    else:
        ddp = DDP(model, broadcast_buffers=bug != "bn-no-broadcast", find_unused_parameters=bug == "unused")
    if bug == "param-edit" and rank == 1:
        with torch.no_grad():
            model.fc1.weight.add_(0.01)

    sampler = None
    if bug == "no-sampler":
        loader = DataLoader(data, batch_size=4)
    elif bug == "stream":
        loader = DataLoader(Stream(data), batch_size=4)
    elif bug == "shards":
        # rank 0: samples 0..5, rank 1: samples 4..9 -> 4, 5 on both ranks; 10..15 on none
        loader = DataLoader(Subset(data, list(range(rank * 4, rank * 4 + 6))), batch_size=2)
    elif bug == "uneven":
        # rank 0: 0..5 (3 batches of 2), rank 1: 6..15 (5 batches): disjoint and complete, but uneven
        indices = list(range(0, 6)) if rank == 0 else list(range(6, 16))
        loader = DataLoader(Subset(data, indices), batch_size=2)
    elif bug == "uneven-last":
        indices = list(range(0, 7)) if rank == 0 else list(range(7, 16))
        loader = DataLoader(Subset(data, indices), batch_size=4)
    elif bug == "shuffle":
        loader = DataLoader(data, batch_size=4, shuffle=True)
    elif bug == "random-split":
        # Unseeded in minGPT-ddp (each process draws its own split); seeded per rank here to be repeatable.
        train, _ = random_split(data, [12, 4], generator=torch.Generator().manual_seed(1000 + rank))
        sampler = DistributedSampler(train, shuffle=True, seed=0)
        loader = DataLoader(train, batch_size=2, sampler=sampler)
    else:
        sampler = DistributedSampler(data, shuffle=True, seed=rank if bug == "seeds" else 0)
        loader = DataLoader(data, batch_size=4, sampler=sampler)

    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        if sampler is not None and bug != "no-set-epoch":
            sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad(set_to_none=True)
            if bug == "no-sync":
                with ddp.no_sync():
                    loss_fn(ddp(x), y).backward()
            else:
                loss_fn(ddp(x), y).backward()
            opt.step()
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
