"""Healthy jobs with traits that fool tools (FAULT=...); nothing is wrong in any of them
    plain            a short, ordinary job
    checkpoint       rank 0 writes a long checkpoint at step FAULT_STEP (CHECKPOINT_S seconds of real work:
                     serialising and writing), the others wait for it in the next all-reduce
    slow-first-step  every rank's first step takes FIRST_S seconds (compilation, warm caches)
    eval-rank0       rank 0 evaluates alone for EVAL_S seconds at step FAULT_STEP (compute, no gradients)
    uneven-last      DistributedSampler(drop_last=False) over a dataset that does not split evenly: the last
                     batch is smaller on some ranks (the sampler pads: the same number of batches everywhere)
    busy-in-c        every rank spends BUSY_S seconds in one long C call (a big linear solve), no Python in between
The marker is written when the trait starts (it is not a fault: the runner only checks that nothing is blamed)."""

import io
import os
import tempfile
import time

import torch
import torch.distributed as dist
from _bench import FAULT, FAULT_STEP, STEPS, batch, mark, setup, train_step
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

rank, world, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)


def busy_for(seconds, what):
    """Real work for ``seconds``: serialise a tensor and write it out, again and again (CPU and I/O)."""
    end = time.time() + seconds
    big = torch.randn(2 << 20)
    with tempfile.TemporaryDirectory() as d:
        while time.time() < end:
            if what == "checkpoint":
                torch.save({"w": big, "model": model.state_dict()}, os.path.join(d, "ckpt.pt"))
            else:
                buf = io.BytesIO()
                torch.save(big, buf)
                with torch.no_grad():
                    model(torch.randn(4096, 16)).sum()


if FAULT == "uneven-last":
    data = TensorDataset(torch.randn(8 * world * STEPS + 5, 16), torch.randint(0, 4, (8 * world * STEPS + 5,)))
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, shuffle=True, drop_last=False))
    if rank == 0:
        mark(FAULT)
    for x, y in loader:
        train_step(model, opt, x, y)
else:
    for step in range(STEPS):
        if step == 0 and FAULT == "slow-first-step":
            mark(FAULT)
            busy_for(float(os.environ.get("FIRST_S", "12")), "eval")
        if step == FAULT_STEP and rank == 0 and FAULT in ("checkpoint", "eval-rank0"):
            mark(FAULT)
            busy_for(float(os.environ.get("CHECKPOINT_S" if FAULT == "checkpoint" else "EVAL_S", "15")), FAULT)
        if step == FAULT_STEP and FAULT == "busy-in-c":
            mark(FAULT)
            a = torch.randn(1400, 1400, dtype=torch.float64)
            end = time.time() + float(os.environ.get("BUSY_S", "15"))
            torch.set_num_threads(1)
            while time.time() < end:
                torch.linalg.solve(a @ a.T + torch.eye(1400, dtype=torch.float64), torch.ones(1400, 1,
                                   dtype=torch.float64))
        train_step(model, opt)
        x, _ = batch()
dist.barrier()
dist.destroy_process_group()
