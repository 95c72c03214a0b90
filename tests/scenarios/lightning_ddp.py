"""A Lightning training script in the spirit of Lightning's own examples (a LightningModule, a Trainer with the DDP
strategy), edited only to run on CPU/gloo: `Trainer(accelerator="cpu", strategy="ddp")` under torchrun. Lightning
adds the DistributedSampler itself (its default), re-creating the DataLoader from its constructor's signature.
`--sleep-rank R --sleep-ms N` makes one rank slow; `--unused-layer` adds a layer the forward never uses (Lightning's
DDP default, find_unused_parameters=False, then fails at the second step)."""

from __future__ import annotations

import argparse
import os
import time

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, sleep_rank: int, sleep_ms: float, unused_layer: bool = False) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1))
        self.head = nn.Linear(32, 1) if unused_layer else None  # never called in training_step
        self.sleep_rank, self.sleep_ms = sleep_rank, sleep_ms

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.global_rank == self.sleep_rank and self.sleep_ms:
            time.sleep(self.sleep_ms / 1000)
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--sleep-rank", type=int, default=-1)
    ap.add_argument("--sleep-ms", type=float, default=0.0)
    ap.add_argument("--no-lightning-sampler", action="store_true", help="Trainer(use_distributed_sampler=False)")
    ap.add_argument("--unused-layer", action="store_true", help="a layer that gets no gradient")
    args = ap.parse_args()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
    loader = DataLoader(data, batch_size=16, shuffle=True)
    trainer = L.Trainer(accelerator="cpu", strategy=DDPStrategy(process_group_backend="gloo"), devices=int(
        os.environ.get("LOCAL_WORLD_SIZE", "1")), max_steps=args.steps, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
        use_distributed_sampler=not args.no_lightning_sampler)
    trainer.fit(Regressor(args.sleep_rank, args.sleep_ms, args.unused_layer), loader)
    print(f"rank {trainer.global_rank} done at step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
