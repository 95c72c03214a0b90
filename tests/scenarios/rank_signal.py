"""Rank 1 (FAULT_RANK) dies of a signal (FAULT_SIGNAL: KILL, SEGV or ABRT) in iteration 4; rank 0 is left waiting for it in the
gradient all_reduce (gloo's timeout is long: ddpdoctor must name rank 1, not rank 0's connection error)."""

import os
import signal

from _common import batch, setup

import torch

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    if rank == int(os.environ.get("FAULT_RANK", "1")) and step == 4:
        sig = os.environ.get("FAULT_SIGNAL", "KILL")
        if sig == "SEGV":
            import ctypes

            ctypes.string_at(0)  # a real segmentation fault, not a signal sent by hand
        os.kill(os.getpid(), getattr(signal, f"SIG{sig}"))
    x, y = batch()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
