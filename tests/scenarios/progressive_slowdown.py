"""Scenario: every step gets a little slower. Plain PyTorch, no stepscope imports.

A per-step bookkeeping cost grows with the step count (like a cache or a list scanned every
step): from 0 to ~40 ms over the run, several times the compute. Diagnose must report a
throughput_regression.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=120)
p.add_argument("--ms-per-step", type=float, default=0.25)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
W = torch.randn(64, 8)
model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 8))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(args.steps):
    xb = torch.randn(128, 64)
    yb = (xb @ W).argmax(1)
    loss = F.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    time.sleep(step * args.ms_per_step / 1000)  # the growing cost
    opt.step()
print(f"done: {args.steps} steps, last loss {loss.item():.4f}")
