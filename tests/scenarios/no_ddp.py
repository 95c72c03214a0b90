"""Trains a model on each rank with no process group and no DDP at all."""

import torch
import torch.nn as nn

model = nn.Linear(8, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(8):
    loss = model(torch.randn(4, 8)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()
