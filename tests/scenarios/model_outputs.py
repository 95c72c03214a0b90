"""DDP models whose forward returns all the shapes real models return; prints a hash of the final parameters.

Each kind trains its own DDP model for --steps steps, one after the other, in the order given by --kinds:

    zerod       the loss as a 0-d tensor (a model that computes its own loss)
    scalar      (loss, accuracy as a Python float)
    onelement   the loss as a 1-element tensor (shape [1])
    tuple       (logits, loss), minGPT's shape
    dict        {"logits": ..., "loss": ...}, Hugging Face's shape
    dataclass   a dataclass with logits and loss
    none        None: the loss is kept on the module (self.loss)
    outside     logits only; the loss is computed outside the model

--lock puts a threading.Lock on the first model (it cannot be deep-copied, as models holding locks or file
handles cannot). The printed hash and the exit code must be the same with and without ddpdoctor."""

import argparse
import dataclasses
import hashlib
import threading

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@dataclasses.dataclass
class Output:
    logits: torch.Tensor
    loss: torch.Tensor


class Net(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.loss: torch.Tensor | None = None

    def forward(self, x, y=None):
        logits = self.fc2(torch.relu(self.fc1(x)))
        if self.kind == "outside":
            return logits
        loss = F.cross_entropy(logits, y)
        if self.kind == "zerod":
            return loss
        if self.kind == "scalar":
            return loss, float((logits.argmax(1) == y).float().mean())
        if self.kind == "onelement":
            return loss.reshape(1)
        if self.kind == "tuple":
            return logits, loss
        if self.kind == "dict":
            return {"logits": logits, "loss": loss}
        if self.kind == "dataclass":
            return Output(logits, loss)
        self.loss = loss  # "none"
        return None


def loss_of(kind: str, model: Net, out, y):
    if kind == "outside":
        return F.cross_entropy(out, y)
    if kind in ("zerod",):
        return out
    if kind == "onelement":
        return out.sum()
    if kind in ("scalar", "tuple"):
        return out[0] if kind == "scalar" else out[1]
    if kind == "dict":
        return out["loss"]
    if kind == "dataclass":
        return out.loss
    return model.loss


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kinds", default="zerod,scalar,onelement,tuple,dict,dataclass,none,outside")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--lock", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    digest = hashlib.sha256()
    for n, kind in enumerate(args.kinds.split(",")):
        torch.manual_seed(0)
        model = Net(kind)
        if args.lock and n == 0:
            model.lock = threading.Lock()
        ddp = DDP(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(100 + rank)
        for _ in range(args.steps):
            x, y = torch.randn(6, 8, generator=gen), torch.randint(0, 4, (6,), generator=gen)
            opt.zero_grad(set_to_none=True)
            out = ddp(x) if kind == "outside" else ddp(x, y)
            loss_of(kind, model, out, y).backward()
            opt.step()
        for p in model.parameters():
            digest.update(p.detach().numpy().tobytes())
    print(f"rank {rank} params {digest.hexdigest()[:16]}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
