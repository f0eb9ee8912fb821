"""Scenario: one rank is slower than the others. Plain PyTorch DDP (gloo), no stepscope
imports. Run with: torchrun --nproc-per-node 2 straggler.py

Rank --slow-rank spends an extra --extra-ms in its forward every step (a slower host);
the other rank waits for it in the gradient all-reduce. Diagnose must name the straggler.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=80)
p.add_argument("--slow-rank", type=int, default=1)
p.add_argument("--extra-ms", type=float, default=30.0)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
W = torch.randn(64, 8)
model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 8)))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(rank)
for _step in range(args.steps):
    xb = torch.randn(64, 64, generator=g)
    yb = (xb @ W).argmax(1)
    if rank == args.slow_rank:
        time.sleep(args.extra_ms / 1000)  # this host is slower
    loss = F.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
print(f"rank {rank} ({os.getpid()}): {args.steps} steps, last loss {loss.item():.4f}")
