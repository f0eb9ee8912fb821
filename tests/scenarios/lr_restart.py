"""Scenario: the LR schedule silently restarts mid-run. Plain PyTorch, no stepscope imports.

Warm-up over 10 steps then linear decay; at --restart-step the scheduler is re-created (as
some versions do under parallel configs), so the LR falls back to its warm-up start.
Diagnose must report lr_schedule at that step.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=120)
p.add_argument("--restart-step", type=int, default=60)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
W = torch.randn(64, 8)
model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 8))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)


def schedule(s: int) -> float:
    return min(1.0, (s + 1) / 10) * max(0.05, 1 - s / args.steps)


sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
for step in range(args.steps):
    if step == args.restart_step:
        sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)  # the silent reset
    xb = torch.randn(128, 64)
    yb = (xb @ W).argmax(1)
    loss = F.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
    sched.step()
print(f"done: {args.steps} steps, last loss {loss.item():.4f}")
