"""Scenario: a healthy run. Plain PyTorch, no stepscope imports.

A small MLP learns a noisy linear classification task from an in-memory DataLoader;
loss falls, LR warms up then decays, nothing is wrong. Under `stepscope run`, diagnose
must raise nothing above info.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=120)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
X = torch.randn(8192, 64)
y = (X @ torch.randn(64, 8)).argmax(1)
y[torch.rand(len(y)) < 0.1] = torch.randint(0, 8, (1,)).item()  # label noise: loss > 0
loader = DataLoader(TensorDataset(X, y), batch_size=128, shuffle=True, drop_last=True)
model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
                      nn.Linear(1024, 8))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.LambdaLR(
    opt, lambda s: min(1.0, (s + 1) / 10) * max(0.1, 1 - s / args.steps))

step = 0
while step < args.steps:
    for xb, yb in loader:
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        if step >= args.steps:
            break
print(f"done: {step} steps, last loss {loss.item():.4f}")
