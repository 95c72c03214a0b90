"""Multi-node, healthy: a slow first step and a slow evaluation step (both under --hang-timeout), then it ends."""

import os
import time

import torch
from _common import batch, setup

rank, model = setup()
opt = torch.optim.SGD(model.parameters(), lr=0.1)
slow = float(os.environ.get("MN_SLOW_S", "2.5"))
steps = int(os.environ.get("MN_STEPS", "8"))
for step in range(steps):
    if step == 0:
        time.sleep(slow)  # first step: compiling, warming caches
    if step == 4:
        time.sleep(slow)  # evaluation on every rank
    x, y = batch()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(float(os.environ.get("MN_STEP_SLEEP_S", "0")))
    if step == 2 and os.environ.get("MN_MARK"):
        open(f"{os.environ['MN_MARK']}.{rank}", "w").close()  # the test knows the job is training
