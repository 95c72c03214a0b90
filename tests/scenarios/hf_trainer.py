"""An HF Trainer script in the spirit of transformers' examples (a model built from a config, TrainingArguments,
Trainer.train), edited only to run on CPU/gloo under torchrun: a tiny GPT-2 on random tokens, no download."""

from __future__ import annotations

import argparse
import tempfile

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class RandomTokens(Dataset):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    config = GPT2Config(vocab_size=128, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(output_dir=out, max_steps=args.steps, per_device_train_batch_size=4,
                                     use_cpu=True, ddp_backend="gloo", report_to=[], save_strategy="no",
                                     logging_strategy="no", disable_tqdm=True, dataloader_num_workers=0)
        Trainer(model=model, args=training, train_dataset=RandomTokens(256, 32, 128)).train()


if __name__ == "__main__":
    main()
