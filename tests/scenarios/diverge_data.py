"""Data positions that part or do not (issue 38): a small DDP job fed by DataLoaders.

    diverge_data.py MODE [OUT]

MODE ``healthy``: two epochs of a DistributedSampler(drop_last=True) over an uneven dataset (set_epoch each), an
evaluation loader that rank 0 alone reads to its end after each epoch, then an epoch where rank 0 has one batch
fewer than rank 1, handled by ``Join``: nothing diverged. MODE ``dry``: rank 0's shard is shorter (3 batches, rank
1's 5) and each rank starts its loader again when it runs out, so from step 4 rank 0 reads its second epoch while
rank 1 is still in its first; 6 steps on both, no hang. MODE ``leave``: the same shorter shard on rank 0, read once
(``for x, y in loader``): rank 0 leaves its loop after step 3 and waits in a final barrier while rank 1 waits in
step 4's gradient all-reduce (a hang: the dry event names it first). With OUT, each rank writes its losses and final weights to
OUT/rankR.pt (the bit-identity test compares them with plain torchrun's)."""

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.join import Join
from torch.utils.data import DataLoader, DistributedSampler

MODE = sys.argv[1]
OUT = sys.argv[2] if len(sys.argv) > 2 else None
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=int(os.environ.get("SCENARIO_GLOO_TIMEOUT", "120"))))
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
gen = torch.Generator().manual_seed(0)
data = [(torch.randn(8, generator=gen), torch.randn(1, generator=gen)) for _ in range(11)]


losses = []


def train(x: torch.Tensor, y: torch.Tensor) -> None:
    opt.zero_grad()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    losses.append(float(loss))


if MODE == "healthy":
    sampler = DistributedSampler(data, drop_last=True, shuffle=True, seed=0)  # 5 samples a rank: 3 batches
    loader = DataLoader(data, batch_size=2, sampler=sampler)
    evaluation = DataLoader(data[:4], batch_size=2)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            train(x, y)
        if rank == 0:
            with torch.no_grad():
                for x, _ in evaluation:  # rank 0 alone reads this loader to its end
                    model.module(x)
    uneven = DataLoader(data[: 6 if rank == 0 else 8], batch_size=2)  # rank 0: 3 batches, rank 1: 4
    with Join([model]):
        for x, y in uneven:
            train(x, y)
elif MODE == "dry":
    loader = DataLoader(data[: 6 if rank == 0 else 10], batch_size=2)  # BUG: rank 0's shard is shorter
    it = iter(loader)
    for step in range(1, 7):
        try:
            x, y = next(it)
        except StopIteration:
            it = iter(loader)  # each rank starts its own loader again: rank 0 reads epoch 1 from step 4
            x, y = next(it)
        train(x, y)
elif MODE == "leave":
    loader = DataLoader(data[: 6 if rank == 0 else 10], batch_size=2)  # BUG: rank 0's shard is shorter
    for x, y in loader:
        train(x, y)
    dist.barrier()  # "wait for everyone": rank 1 never comes, it waits in step 4's backward
if OUT:
    os.makedirs(OUT, exist_ok=True)
    torch.save({"losses": losses, "weights": [p.detach().clone() for p in model.parameters()]},
               os.path.join(OUT, f"rank{rank}.pt"))
dist.destroy_process_group()
