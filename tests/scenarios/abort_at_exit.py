"""Every rank trains to the end; then, at interpreter teardown (after ddpdoctor's probe wrote its exit status 0),
rank ABORT_RANK (default 1) dies as torch 2.13's gloo sometimes does there: libstdc++'s terminate handler prints
"terminate called without an active exception" and the process ends by SIGABRT, so torchrun exits 1.

The abort is made on purpose, in an atexit handler (which runs after the script and the probe's status write, as
the real one does): the same words on stderr, the same signal, at the same moment, every time."""

import atexit
import os
import sys

import torch
import torch.distributed as dist
from _common import batch, setup

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(int(os.environ.get("SCENARIO_STEPS", "6"))):
    x, y = batch()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()


def _teardown_abort() -> None:
    sys.stderr.write("terminate called without an active exception\n")
    sys.stderr.flush()
    os.abort()


if rank == int(os.environ.get("ABORT_RANK", "1")):
    atexit.register(_teardown_abort)
