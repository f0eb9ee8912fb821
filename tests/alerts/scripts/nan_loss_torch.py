"""Plain PyTorch, no stepscope imports: the loss turns NaN at step --nan-at, then the loop
goes on (a test SIGKILLs it), at most --steps steps."""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=2000)
p.add_argument("--nan-at", type=int, default=8)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
for step in range(args.steps):
    xb = torch.randn(16, 32)
    loss = F.cross_entropy(model(xb), xb[:, :4].argmax(1))
    if step >= args.nan_at:
        loss = loss * float("nan")
    opt.zero_grad()
    loss.backward()
    time.sleep(0.05)
    opt.step()
