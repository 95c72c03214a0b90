"""An accelerate training loop in the spirit of accelerate's examples (Accelerator, prepare, accelerator.backward),
edited only to run on CPU/gloo under torchrun. `--seed-per-rank` seeds torch with seed + rank before prepare(): the
bug of issue 27 (each rank shuffles in its own order, then keeps its share of the batches). `--no-prepare-loader`
leaves the DataLoader out of accelerator.prepare() (issue 39): every rank reads the whole dataset."""

from __future__ import annotations

import argparse
import os

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed-per-rank", action="store_true")
    ap.add_argument("--no-prepare-loader", action="store_true")
    ap.add_argument("--steps", type=int, default=8)
    args = ap.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(42 + rank if args.seed_per_rank else 42)
    accelerator = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    fixed = torch.Generator().manual_seed(0)  # the data itself is the same on every rank (read from disk, say)
    data = TensorDataset(torch.arange(256, dtype=torch.float32).unsqueeze(1), torch.randn(256, 1, generator=fixed))
    loader = DataLoader(data, batch_size=8, shuffle=True)
    model = nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    if args.no_prepare_loader:
        model, opt = accelerator.prepare(model, opt)
    else:
        model, opt, loader = accelerator.prepare(model, opt, loader)
    for step, (x, y) in enumerate(loader):
        if step == args.steps:
            break
        loss = nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    accelerator.print("done")


if __name__ == "__main__":
    main()
