"""Plain PyTorch DDP (gloo), no stepscope imports: rank --slow-rank's forward sleeps an
extra --extra-ms every step (a slower host); the other rank waits for it in the gradient
all-reduce. Run with: torchrun --standalone --nproc-per-node 2 ddp_slow_rank.py
"""

import argparse
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=60)
p.add_argument("--slow-rank", type=int, default=1)
p.add_argument("--extra-ms", type=float, default=60.0)
args = p.parse_args()


class SlowerHost(nn.Module):
    """Identity whose forward takes --extra-ms longer on the slow rank (its own work)."""

    def __init__(self, extra_s: float) -> None:
        super().__init__()
        self.extra_s = extra_s

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.extra_s:
            time.sleep(self.extra_s)
        return x


dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
torch.set_num_threads(1)
extra = args.extra_ms / 1000 if rank == args.slow_rank else 0.0
model = DDP(nn.Sequential(SlowerHost(extra), nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8)))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
g = torch.Generator().manual_seed(rank)
for _ in range(args.steps):
    xb = torch.randn(32, 64, generator=g)
    loss = F.cross_entropy(model(xb), xb[:, :8].argmax(1))
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
