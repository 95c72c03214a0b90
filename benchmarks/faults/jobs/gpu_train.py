"""The GPU tier's job: a small DDP model on CUDA (nccl when there are GPUs for every rank, else gloo with CUDA
tensors), STEPS steps. FAULT: none | stuck-io (FAULT_RANK blocks reading a pipe at FAULT_STEP, the others wait in
NCCL) | straggler (FAULT_RANK sleeps SLOW_S in forward every step) | skip-step (FAULT_RANK skips one optimizer
step: its parameters diverge)."""

import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

FAULT = os.environ.get("FAULT", "none")
FAULT_RANK = int(os.environ.get("FAULT_RANK", "1"))
FAULT_STEP = int(os.environ.get("FAULT_STEP", "5"))
STEPS = int(os.environ.get("STEPS", "60"))
SLOW_S = float(os.environ.get("SLOW_S", "0.03"))

local = int(os.environ.get("LOCAL_RANK", "0"))
backend = "nccl" if torch.cuda.device_count() >= int(os.environ.get("LOCAL_WORLD_SIZE", "1")) else "gloo"
torch.cuda.set_device(local % torch.cuda.device_count())
dist.init_process_group(backend)
rank = dist.get_rank()
dev = torch.device("cuda", local % torch.cuda.device_count())
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(1024, 4096), nn.ReLU(), nn.Linear(4096, 1024)).to(dev)
model = DDP(net, device_ids=[dev.index])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
me = rank == FAULT_RANK
for step in range(STEPS):
    if me and step == FAULT_STEP and FAULT == "stuck-io":
        fifo = os.path.join(tempfile.mkdtemp(), "never")
        os.mkfifo(fifo)
        with open(fifo, "rb") as f:
            f.read()
    x = torch.randn(256, 1024, device=dev)
    if me and FAULT == "straggler" and step >= FAULT_STEP:
        time.sleep(SLOW_S)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    if not (me and FAULT == "skip-step" and step == FAULT_STEP):
        opt.step()
torch.cuda.synchronize()
dist.destroy_process_group()
