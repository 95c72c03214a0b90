"""The shapes the watch must see through (issue 36): collectives no torch.distributed call of the script's own makes.

    watch_shapes.py MODEL FAULT [STEPS]

MODEL:
- ``bn``: a BatchNorm CNN under DDP (broadcast_buffers=True: DDP broadcasts the buffers at every forward, from C++),
  fed by a DataLoader whose dataset applies transforms that are nn.Modules in ``__getitem__``, with a loss module
  and a metric module outside the model;
- ``bert``: a BERT-like model with a non-trainable ``position_ids`` buffer under DDP, driven by a framework-style
  engine (the loop lives in a library class, events fire handlers) with gradient accumulation: the model is called
  twice per optimizer step;
- ``fsdp``: FSDP2 ``fully_shard`` on two blocks and the root (gloo, CPU).

FAULT: ``none``; ``slowdata`` (every rank's transforms take 2 ms a sample: data loading is a large share of the
step, on every rank alike); ``hang`` (rank 1 stops forever at step 3: before its forward, or for fsdp inside the first block,
before the second block's all-gather); ``slow`` (rank 1 spends 50 ms more per step in its data loading, before the
forward: the others wait for it in the buffer broadcast)."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

MODEL, FAULT = sys.argv[1], sys.argv[2]
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 12
HANG_STEP = 3
SLOW_S = 0.05

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=int(os.environ.get("SCENARIO_GLOO_TIMEOUT", "120"))))
rank = dist.get_rank()
torch.manual_seed(0)


def stall(step):
    if rank == 1 and FAULT == "hang" and step == HANG_STEP:
        time.sleep(3600)  # BUG: rank 1 stops here


# -- transforms as modules (torchvision's are nn.Modules, run in __getitem__) -----------------------------------------
class Normalize(nn.Module):
    def forward(self, x):
        return (x - x.mean()) / (x.std() + 1e-6)


class Jitter(nn.Module):
    def forward(self, x):
        if FAULT == "slowdata":
            time.sleep(0.002)
        return x + 0.01 * torch.randn_like(x)


class Images(Dataset):
    def __init__(self):
        self.transform = nn.Sequential(Normalize(), Jitter())

    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        if i % 8 == 0:
            stall(i // 8)
            if rank == 1 and FAULT == "slow":
                time.sleep(SLOW_S)  # rank 1's data loading is slower: a straggler
        return self.transform(torch.randn(3, 16, 16)), i % 4


class Accuracy(nn.Module):
    def forward(self, logits, y):
        return (logits.argmax(1) == y).float().mean()


def train_bn():
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                              nn.Flatten(), nn.Linear(8, 4)), broadcast_buffers=True)
    loss_fn, metric = nn.CrossEntropyLoss(), Accuracy()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step, (x, y) in enumerate(DataLoader(Images(), batch_size=8)):
        if step == STEPS:
            break
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            metric(model.module(x), y)


# -- a BERT-like model with a non-trainable buffer, in a framework-style engine ----------------------------------------
class TinyBert(nn.Module):
    def __init__(self, vocab=64, dim=16, seq=8):
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.register_buffer("position_ids", torch.arange(seq).expand((1, -1)), persistent=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 4)

    def forward(self, ids):
        h = self.norm(self.tok(ids) + self.pos(self.position_ids[:, : ids.shape[1]]))
        return self.head(h.mean(1))


class Engine:
    """The loop as a library owns it: ``run`` iterates, handlers fire on events (Ignite-, Lightning-like)."""

    def __init__(self, step_fn):
        self.step_fn = step_fn
        self.handlers = {"started": [], "completed": []}
        self.iteration = 0

    def on(self, event, fn):
        self.handlers[event].append(fn)

    def run(self, data, max_iters):
        for batch in data:
            if self.iteration == max_iters:
                break
            for fn in self.handlers["started"]:
                fn(self)
            self.step_fn(self, batch)
            self.iteration += 1
            for fn in self.handlers["completed"]:
                fn(self)


class Tokens(Dataset):
    def __len__(self):
        return 10_000

    def __getitem__(self, i):
        return torch.randint(0, 64, (8,)), i % 4


def train_bert():
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(TinyBert())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    def step_fn(engine, batch):
        ids, y = batch
        stall(engine.iteration)
        if rank == 1 and FAULT == "slow":
            time.sleep(SLOW_S)
        with model.no_sync():  # gradient accumulation: the model runs twice per optimizer step
            loss_fn(model(ids[:4]), y[:4]).backward()
        loss_fn(model(ids[4:]), y[4:]).backward()
        opt.step()
        opt.zero_grad()

    Engine(step_fn).run(DataLoader(Tokens(), batch_size=8), STEPS)


# -- FSDP2 ---------------------------------------------------------------------------------------------------------------
class Block(nn.Module):
    def __init__(self, first):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.first = first
        self.calls = 0

    def forward(self, x):
        out = torch.relu(self.lin(x))
        if self.first:
            stall(self.calls)  # inside the first block: the second block's all-gather is next
            self.calls += 1
        return out


def train_fsdp():
    from torch.distributed.fsdp import fully_shard

    model = nn.Sequential(Block(True), Block(False), nn.Linear(16, 4))
    fully_shard(model[0])
    fully_shard(model[1])
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        if rank == 1 and FAULT == "slow":
            time.sleep(SLOW_S)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()


{"bn": train_bn, "bert": train_bert, "fsdp": train_fsdp}[MODEL]()
dist.destroy_process_group()
