"""FSDP2 training on CPU/gloo: an MLP of 4 Linear layers and a buffer (a fixed output scale, as a model keeps a
mask or a RoPE table), `fully_shard` on each Linear and on the root, AdamW.

    --mesh 1d        FSDP on a 1-D mesh of every rank (2 ranks)
    --mesh hsdp      HSDP on a 2-D mesh ("replicate", "shard") of 2x2 (4 ranks)
    --mesh tp        no FSDP: a 1-D "tp" mesh, the first Linear column-parallel, the second row-parallel, and a
                     LayerNorm whose weight is a DTensor Replicate()d over "tp" (as TP leaves norm weights)
    --prefetch       explicit set_modules_to_forward_prefetch / set_modules_to_backward_prefetch (one unit ahead)
    --bug drift      (tp) rank 1 changes its copy of the replicated norm weight after the first step
    --bug buffer     rank 1 changes its copy of the buffer after the first step
    --bug skip-step  rank 1 skips optimizer.step() at step 2 (a rank-local "gradient norm too large")
    --bug nan        rank 1's loss is NaN at step --nan-at (0-based; the fingerprint's step --nan-at + 1): FSDP2's
                     reduce-scatter averages it into every rank's shards (issue 38)
    --bug freeze-unit rank 1 freezes unit "0" (requires_grad=False) at step --freeze-at: FSDP2 skips that unit's
                     reduce-scatter there, so the ranks part at it (saforem2/ezpz#242's shape: a rank that takes
                     another path through the units)
                     (--bug may be given more than once)
    --steps N        iterations (default 8)
    --out DIR        each rank writes DIR/rankR.pt: the steps whose optimizer step ran, and whether its shards are finite
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh

p = argparse.ArgumentParser()
p.add_argument("--mesh", default="1d", choices=["1d", "hsdp", "tp"])
p.add_argument("--prefetch", action="store_true")
p.add_argument("--bug", action="append", default=[], choices=["drift", "buffer", "skip-step", "freeze-unit", "nan"])
p.add_argument("--steps", type=int, default=8)
p.add_argument("--freeze-at", type=int, default=2)
p.add_argument("--width", type=int, default=256)
p.add_argument("--nan-at", type=int, default=2)
p.add_argument("--out")
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
W = args.width


class Scale(nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.register_buffer("scale", torch.full((n,), 0.5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


model = nn.Sequential(nn.Linear(W, W), nn.ReLU(), nn.Linear(W, W), nn.ReLU(), nn.Linear(W, W), nn.ReLU(),
                      nn.Linear(W, 8), Scale(8))

if args.mesh == "tp":
    from torch.distributed.tensor import Replicate, distribute_tensor
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    model = nn.Sequential(nn.Linear(W, W), nn.ReLU(), nn.Linear(W, W), nn.LayerNorm(W))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel(use_local_output=False)})
    norm = model[3]
    norm.weight = nn.Parameter(distribute_tensor(norm.weight.detach(), mesh, [Replicate()]))
    norm.bias = nn.Parameter(distribute_tensor(norm.bias.detach(), mesh, [Replicate()]))
    units: list[nn.Module] = []
else:
    from torch.distributed.fsdp import fully_shard

    if args.mesh == "hsdp":
        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
    else:
        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    units = [m for m in model if isinstance(m, nn.Linear)]
    for m in units:
        fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    if args.prefetch:
        for a, b in zip(units, units[1:]):
            a.set_modules_to_forward_prefetch([b])
            b.set_modules_to_backward_prefetch([a])

opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1 + rank)
if args.mesh == "tp":
    # TP ranks read the same batches: one data-parallel rank (num_replicas=1), as a TP job's loader does
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    data = TensorDataset(torch.randn(16 * args.steps, W, generator=torch.Generator().manual_seed(1)))
    batches = iter(DataLoader(data, batch_size=16, sampler=DistributedSampler(data, num_replicas=1, rank=0)))
applied = []
try:
    for step in range(args.steps):
        x = next(batches)[0] if args.mesh == "tp" else torch.randn(16, W, generator=g)
        if "freeze-unit" in args.bug and step == args.freeze_at and rank == 1:
            model[0].requires_grad_(False)
        loss = model(x).square().mean()
        if "nan" in args.bug and step == args.nan_at and rank == 1:
            loss = loss * float("nan")  # BUG: one rank's loss is NaN
        opt.zero_grad()
        loss.backward()
        if not ("skip-step" in args.bug and step == 2 and rank == 1):
            opt.step()
            applied.append(step)
        if "drift" in args.bug and step == 0 and rank == 1:
            with torch.no_grad():
                model[3].weight.to_local().mul_(1.01)
        if "buffer" in args.bug and step == 0 and rank == 1:
            model[7].scale.mul_(1.01)
finally:
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        local = [p.to_local() if hasattr(p, "to_local") else p for p in model.parameters()]
        torch.save({"applied": applied, "finite": all(bool(torch.isfinite(t).all()) for t in local)},
                   os.path.join(args.out, f"rank{rank}.pt"))
dist.destroy_process_group()
if os.environ.get("FSDP_TRAIN_SAY_DONE"):
    print(f"rank {rank} done")
