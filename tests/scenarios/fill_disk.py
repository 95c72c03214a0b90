"""A healthy 2-rank job that fills the disk under ddpdoctor's run directory half-way through, as a checkpoint that
grows past the free space does: at step FILL_AT_STEP (default 5) rank 0 writes FILL_PATH until the disk is full
(ENOSPC, which the script catches: its own business), then every rank trains on for STEPS_AFTER more steps and
ends with exit 0. ddpdoctor must neither break the job nor lose the run (docs/trust.md, full disks)."""

import os
import time

import torch
import torch.distributed as dist
from _common import batch, setup

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
fill_at = int(os.environ.get("FILL_AT_STEP", "5"))
total = fill_at + int(os.environ.get("STEPS_AFTER", "10"))
for step in range(total):
    if step == fill_at and rank == 0:
        chunk = b"\0" * 4096
        fd = os.open(os.environ["FILL_PATH"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            while True:
                os.write(fd, chunk)
        except OSError:  # the disk is full: the checkpoint is truncated, training goes on
            pass
        finally:
            os.close(fd)
        print(f"filled {os.environ['FILL_PATH']}", flush=True)
    dist.barrier()  # every rank sees the full disk from here on
    x, y = batch()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(float(os.environ.get("STEP_SLEEP_S", "0.1")))
    print(f"step {step} loss {loss.item():.4f}", flush=True)
dist.destroy_process_group()
