"""Scenario: the loss turns NaN at a given step. Plain PyTorch, no stepscope imports.

At --nan-step one input value becomes NaN (a corrupt record); the NaN propagates through
backward into the weights, so every later loss is NaN too. Diagnose must report numerics
at that step.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=100)
p.add_argument("--nan-step", type=int, default=60)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
W = torch.randn(64, 8)
model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for step in range(args.steps):
    xb = torch.randn(128, 64)
    yb = (xb @ W).argmax(1)
    if step == args.nan_step:
        xb[3, 5] = float("nan")  # a corrupt record
    loss = F.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"done: {args.steps} steps, last loss {loss.item()}")
