"""Divergence (FAULT=...): ranks that should hold the same model stop doing so; one rank (FAULT_RANK) from step
FAULT_STEP unless said otherwise
    nan                 its loss turns NaN (a bad sample): NaN gradients all-reduced into every rank
    skip-step           skips optimizer.step() (a rank-local "gradient norm too large" decision)
    param-edit          edits a weight in place after DDP wrapped the model (a rank-local re-init)
    grad-scale          scales its own gradients after backward (a rank-local loss-scale bug)
    no-sync             runs forward and backward under no_sync(): it never joins the gradient all-reduce the
                        others wait in (a skipped collective, which on gloo ends in a hang or an abort)
    buffers             every rank: BatchNorm with broadcast_buffers=False: running stats drift apart
    sampler-none        every rank: no DistributedSampler, every rank sees every sample
    sampler-no-set-epoch  every rank: shuffle without set_epoch: the same order each epoch
    sampler-seeds       every rank: DistributedSampler(seed=rank): shards overlap
    none                healthy"""

import math

import torch
import torch.distributed as dist
import torch.nn as nn
from _bench import FAULT, FAULT_STEP, is_fault_rank, mark
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
me = is_fault_rank(rank)
torch.manual_seed(0)
data = TensorDataset(torch.randn(64, 8), torch.randint(0, 4, (64,)))
bn = FAULT == "buffers"
net = nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16) if bn else nn.Identity(), nn.ReLU(), nn.Linear(16, 4))
ddp = DDP(net, broadcast_buffers=not bn)
if FAULT == "sampler-none":
    sampler = None
    loader = DataLoader(data, batch_size=4)
else:
    sampler = DistributedSampler(data, shuffle=True, seed=rank if FAULT == "sampler-seeds" else 0)
    loader = DataLoader(data, batch_size=4, sampler=sampler)
if FAULT.startswith("sampler") or FAULT == "buffers":
    if rank == 0:
        mark(FAULT)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
step = 0
for epoch in range(3):
    if sampler is not None and FAULT != "sampler-no-set-epoch":
        sampler.set_epoch(epoch)
    for x, y in loader:
        fault_now = me and step == FAULT_STEP
        if fault_now and FAULT in ("nan", "skip-step", "param-edit", "grad-scale", "no-sync"):
            mark(FAULT)
        opt.zero_grad()
        if me and step >= FAULT_STEP and FAULT == "no-sync":
            with ddp.no_sync():  # DDP reads no_sync at forward: both go inside
                nn.functional.cross_entropy(ddp(x), y).backward()
        else:
            loss = nn.functional.cross_entropy(ddp(x), y)
            if fault_now and FAULT == "nan":
                loss = loss * math.nan
            loss.backward()
        if me and step >= FAULT_STEP and FAULT == "grad-scale":
            for p in ddp.parameters():
                p.grad.mul_(2.0)
        if not (fault_now and FAULT == "skip-step"):
            opt.step()
        if fault_now and FAULT == "param-edit":
            with torch.no_grad():
                net[0].weight.add_(0.01)
        step += 1
dist.destroy_process_group()
