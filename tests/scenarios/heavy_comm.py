"""Scenario: gradient communication dominates the step. Plain PyTorch DDP (gloo), no
stepscope imports. Run with: torchrun --nproc-per-node 2 heavy_comm.py

A deep stack of wide layers with a tiny batch (little compute, many gradients) and tiny DDP
buckets (one all-reduce per ~16 KB instead of 25 MB): hundreds of small collectives per
step. Diagnose must report communication.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=40)
p.add_argument("--bucket-mb", type=float, default=0.016)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
layers = []
for _ in range(12):
    layers += [nn.Linear(256, 256), nn.ReLU()]
model = DDP(nn.Sequential(*layers, nn.Linear(256, 8)), bucket_cap_mb=args.bucket_mb)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
W = torch.randn(256, 8)
g = torch.Generator().manual_seed(rank)
for _step in range(args.steps):
    xb = torch.randn(8, 256, generator=g)
    yb = (xb @ W).argmax(1)
    loss = F.cross_entropy(model(xb), yb)
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
print(f"rank {rank}: {args.steps} steps, last loss {loss.item():.4f}")
