"""Stragglers (FAULT=...): from step FAULT_STEP on, one rank (FAULT_RANK) loses SLOW_S seconds per step
    forward          in its model's forward
    backward         inside backward (a gradient hook)
    data             loading its batch
    optimizer        in an optimizer pre-step hook
    host-contention  a busy Python thread of its own competes for the interpreter and the core
    gc               garbage-collection pauses: a large live object graph collected every step
    delayed-collective  it reaches the per-step metric all_reduce late (logging before it)
    none             healthy (the same job without a straggler)"""

import gc
import os
import threading
import time

import torch
import torch.distributed as dist
from _bench import FAULT, FAULT_STEP, STEPS, is_fault_rank, mark
from torch.nn.parallel import DistributedDataParallel as DDP

SLOW_S = float(os.environ.get("SLOW_S", "0.06"))
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
me = is_fault_rank(rank)
state = {"slow": False}


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(64, 128)
        self.b = torch.nn.Linear(128, 64)

    def forward(self, x):
        if state["slow"] and FAULT == "forward":
            time.sleep(SLOW_S)
        return self.b(torch.relu(self.a(x)))


net = Net()
if me and FAULT == "backward":
    net.b.weight.register_hook(lambda g: time.sleep(SLOW_S) if state["slow"] else None)
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
if me and FAULT == "optimizer":
    opt.register_step_pre_hook(lambda *a: time.sleep(SLOW_S) if state["slow"] else None)
graph = []


def spin():
    while True:  # pure Python: holds the interpreter lock in turns with the training thread
        sum(i * i for i in range(1000))


steps = int(os.environ.get("STEPS", "90")) if "STEPS" in os.environ else max(STEPS, 90)
for step in range(steps):
    if me and step == FAULT_STEP and FAULT != "none":
        state["slow"] = True
        mark(FAULT)
        if FAULT == "host-contention":
            for _ in range(2):
                threading.Thread(target=spin, daemon=True).start()
        if FAULT == "gc":
            graph = [[i, {}] for i in range(400_000)]
            for a, b in zip(graph, graph[1:], strict=False):
                a[1]["next"] = b  # cycles: only the cyclic collector reclaims them
    time.sleep(0.01 + (SLOW_S if state["slow"] and FAULT == "data" else 0.0))  # loading the batch
    if state["slow"] and FAULT == "gc":
        gc.collect()
    x = torch.randn(32, 64)
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if state["slow"] and FAULT == "delayed-collective":
        time.sleep(SLOW_S)  # logging before the metric all_reduce
    dist.all_reduce(loss.detach().reshape(1))
dist.destroy_process_group()
