"""Scenario: one bad batch makes the loss spike. Plain PyTorch, no stepscope imports.

At --spike-step the batch is corrupt (features scaled x20, labels shuffled): the loss jumps
for that step, then training recovers. Diagnose must report a loss_spike at that step.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=120)
p.add_argument("--spike-step", type=int, default=70)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
W = torch.randn(64, 8)
model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                      nn.Linear(512, 8))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(args.steps):
    xb = torch.randn(128, 64)
    yb = (xb @ W).argmax(1)
    if step == args.spike_step:
        xb = xb * 20
        yb = yb[torch.randperm(len(yb))]
    loss = F.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
print(f"done: {args.steps} steps, last loss {loss.item():.4f}")
