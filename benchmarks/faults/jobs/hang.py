"""Hangs (FAULT=...): one rank (FAULT_RANK) at step FAULT_STEP
    skip-allreduce     skips the per-step metric all_reduce the others call
    extra-collective   calls a broadcast the others do not
    shape-mismatch     all_reduces a statistics tensor of another size
    op-mismatch        all_gathers where the others all_reduce
    exit-early         leaves the job (sys.exit(0)) while the others go on
    loader-exhausted   its loader has fewer batches: it reaches the end-of-epoch barrier first
    stuck-io           blocks reading a pipe nobody writes (a stuck network filesystem read)
    stuck-lock         waits for a lock another of its threads never releases
    stuck-loader       a sample that never loads (its Dataset.__getitem__ blocks)
    stuck-worker       a DataLoader worker process that never returns a batch
    teardown           training done, a non-daemon thread of its own keeps its process from ever exiting"""

import os
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
from _bench import FAULT, FAULT_STEP, STEPS, is_fault_rank, mark, setup, train_step
from torch.utils.data import DataLoader, Dataset

rank, world, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
me = is_fault_rank(rank)


def block_forever(what):
    mark(what)
    if what == "stuck-io":
        fifo = os.path.join(tempfile.mkdtemp(), "never")
        os.mkfifo(fifo)
        with open(fifo, "rb") as f:  # BUG: a read that never returns
            f.read()
    elif what == "stuck-lock":
        lock = threading.Lock()
        t = threading.Thread(target=lock.acquire, daemon=True)
        t.start()
        t.join()
        lock.acquire()  # BUG: held by a thread that is gone
    else:
        time.sleep(100000)


class Samples(Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if me and FAULT == "stuck-loader" and i == FAULT_STEP * 8:
            block_forever("sleep")
        if me and FAULT == "stuck-worker" and i == FAULT_STEP * 8:
            mark("stuck-worker")  # the mark file carries the worker's pid; the rank's time is what counts
            time.sleep(100000)
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g), i % 4


if FAULT in ("stuck-loader", "stuck-worker", "loader-exhausted"):
    n = STEPS * 8
    if me and FAULT == "loader-exhausted":
        n = FAULT_STEP * 8  # BUG: this rank's shard is shorter
    workers = 2 if FAULT == "stuck-worker" else 0
    for x, y in DataLoader(Samples(n), batch_size=8, num_workers=workers):
        train_step(model, opt, x, y)
    if me and FAULT == "loader-exhausted":
        mark("loader-exhausted")
    dist.barrier()
    dist.destroy_process_group()
    sys.exit(0)

for step in range(STEPS):
    if me and step == FAULT_STEP:
        if FAULT in ("stuck-io", "stuck-lock"):
            block_forever(FAULT)
        if FAULT == "exit-early":
            mark(FAULT)
            sys.exit(0)  # BUG: leaves while the others train on
        if FAULT == "extra-collective":
            mark(FAULT)
            dist.broadcast(torch.zeros(3), src=rank)  # BUG: only this rank calls it
    loss = train_step(model, opt)
    metric = loss.detach().reshape(1)
    if step == FAULT_STEP and FAULT == "shape-mismatch":
        if me:
            mark(FAULT)
        stats = torch.zeros(8 if me else 4)  # BUG: this rank's statistics have another length
        dist.all_reduce(stats)
    if step == FAULT_STEP and FAULT == "op-mismatch" and me:
        mark(FAULT)
        out = [torch.zeros(1) for _ in range(world)]
        dist.all_gather(out, metric)  # BUG: the others all_reduce here
    elif step == FAULT_STEP and FAULT == "skip-allreduce" and me:
        mark(FAULT)  # BUG: skips the metric all_reduce the others run
    else:
        dist.all_reduce(metric)
if FAULT == "teardown" and me:
    mark(FAULT)
    threading.Thread(target=time.sleep, args=(100000,)).start()  # BUG: a non-daemon thread keeps it alive
dist.barrier()
dist.destroy_process_group()
