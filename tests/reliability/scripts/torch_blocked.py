"""Rank 1 ends up blocked in a C++ collective (reliability fixture).

Both ranks do ``--steps`` DDP steps; then rank 0 sleeps in Python and rank 1 enters
``dist.barrier()``, which cannot complete: it waits inside gloo, never returning to the
interpreter. Prints ``BLOCKED <pid>`` from rank 1 just before the barrier.
Run: ``torchrun --nproc-per-node 2 torch_blocked.py``.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=5)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
model = DDP(nn.Linear(8, 8))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(args.steps):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
if rank == 0:
    time.sleep(600)
else:
    print(f"BLOCKED {os.getpid()}", flush=True)
    dist.barrier()
