"""Ranks that go their own way (issue 38): a small DDP job where one rank does something the others do not.

    diverge.py FAULT [STEPS] [OUT]

FAULT: ``freeze-all`` (healthy: DDP with find_unused_parameters, every rank freezes the first layer at step 3, as
a fine-tuning schedule does); ``none`` (healthy; rank 0 also runs an evaluation forward under no_grad every 4 steps, on rank 0 only);
``skip`` (rank 1, or $DIVERGE_RANK, skips its optimizer step at step 5: a rank-local loss check); ``nan`` (rank 1's loss is NaN at
step 5: all-reduced into every replica); ``reduceop`` (at step 5 every rank all-reduces a metric, rank 1 with MAX
where the others SUM: no hang, no error, a silently different result); ``recompile`` (every rank runs a
torch.compile'd statistic, backend "eager", each step; at step 5 rank 1 hands it another shape: it alone
recompiles); ``shape`` (at step 5 every rank all-reduces 8 statistics, rank 1 as a 2x4 tensor, the others as 8:
gloo sums them without a word); ``frozen`` (at step 3 rank 1 alone freezes the first layer of its DDP-wrapped model,
the ezpz#242 shape: its gradient buckets differ from then on); ``gnorm`` (the output is multiplied by a scale
parameter outside DDP, whose gradient is each rank's own, and every rank clips its gradient norm; at step 5 rank 1's
scale gradient overflows to inf: its norm alone goes non-finite, the loss stays finite). With OUT,
each rank writes its losses and final weights to OUT/rankR.pt (the stop and bit-identity tests read them)."""

import datetime
import math
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn

# Launchers that pass no arguments (tests/e2e/test_multinode.start_nodes) give them as DIVERGE_* variables.
FAULT = sys.argv[1] if len(sys.argv) > 1 else os.environ["DIVERGE_FAULT"]
STEPS = int(sys.argv[2] if len(sys.argv) > 2 else os.environ.get("DIVERGE_STEPS", "12"))
OUT = sys.argv[3] if len(sys.argv) > 3 else os.environ.get("DIVERGE_OUT")
AT = 5
BAD = int(os.environ.get("DIVERGE_RANK", "1"))  # the rank that goes its own way

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=int(os.environ.get("SCENARIO_GLOO_TIMEOUT", "120"))))
rank = dist.get_rank()
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
model = nn.parallel.DistributedDataParallel(net, find_unused_parameters=FAULT == "freeze-all")
scale = nn.Parameter(torch.ones(1))  # gnorm: outside DDP, so its gradient is this rank's own
opt = torch.optim.SGD([*model.parameters(), scale] if FAULT == "gnorm" else model.parameters(), lr=0.01)
gen = torch.Generator().manual_seed(1 + rank)
stat = torch.compile(lambda t: (t * t).mean(), backend="eager") if FAULT == "recompile" else None
losses = []
applied = []  # the steps whose update reached the weights
at = {}  # step -> when its loss was known (the detection-time figure: RUN/divergence.json's detected_at minus this)
try:
    for step in range(1, STEPS + 1):
        if FAULT == "frozen" and rank == BAD and step == 3:
            net[0].requires_grad_(False)  # BUG: one rank alone freezes a layer (a LoRA or freeze schedule)
        if FAULT == "freeze-all" and step == 3:
            net[0].requires_grad_(False)  # every rank alike: DDP (find_unused_parameters) takes it
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 1, generator=gen)
        loss = nn.functional.mse_loss(model(x) * scale if FAULT == "gnorm" else model(x), y)
        if stat is not None:
            stat(x[:3] if rank == BAD and step == AT else x)  # BUG: another shape on one rank: it recompiles
        if FAULT == "nan" and rank == BAD and step == AT:
            loss = loss * float("nan")  # BUG: one rank's loss is NaN at step 5
        opt.zero_grad()
        loss.backward()
        losses.append(float(loss))
        if FAULT == "gnorm":
            if rank == BAD and step == AT:
                scale.grad.fill_(float("inf"))  # BUG: a gradient no one averages overflows on one rank
            torch.nn.utils.clip_grad_norm_([*model.parameters(), scale], 1.0)
        at[step] = time.time()
        if FAULT == "reduceop" and step == AT:
            dist.all_reduce(loss.detach().clone(), op=dist.ReduceOp.MAX if rank == BAD else dist.ReduceOp.SUM)  # BUG
        if FAULT == "shape" and step == AT:
            dist.all_reduce(torch.ones(2, 4) if rank == BAD else torch.ones(8))  # BUG: another shape on one rank
        if FAULT == "skip" and rank == BAD and step == AT:
            continue  # BUG: one rank alone decides to skip this step
        opt.step()
        applied.append(step)
        if FAULT == "none" and rank == 0 and step % 4 == 0:
            with torch.no_grad():
                model.module(torch.randn(2, 8, generator=gen))  # evaluation on rank 0 only
finally:
    if OUT:
        os.makedirs(OUT, exist_ok=True)
        torch.save({"losses": losses, "applied": applied, "at": at, "finite": all(math.isfinite(float(p.sum()))
                    for p in model.parameters()), "weights": [p.detach().clone() for p in model.parameters()]},
                   os.path.join(OUT, f"rank{rank}.pt"))
dist.destroy_process_group()
