"""DDP with uneven inputs (reliability fixture; knows nothing of stepscope).

The documented ``model.join()`` pattern: rank 0 has ``--long`` batches, the other ranks
``--short``; after the loop every rank calls ``barrier`` and ``all_reduce`` of its batch
count, as scripts do to agree on a total. Prints ``RANK r TOTAL n`` at the end.
Run: ``torchrun --nproc-per-node 2 torch_uneven_join.py``.
"""

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

p = argparse.ArgumentParser()
p.add_argument("--long", type=int, default=45)
p.add_argument("--short", type=int, default=30)
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(rank)
model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
batches = args.long if rank == 0 else args.short
with model.join():
    for _ in range(batches):
        x = torch.randn(8, 16)
        loss = (model(x) - x).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
dist.barrier()
total = torch.tensor([float(batches)])
dist.all_reduce(total)
print(f"RANK {rank} TOTAL {int(total.item())}", flush=True)
# No destroy_process_group(): after model.join() it aborts about every other run on
# torch 2.13 + gloo ("terminate called without an active exception"), stepscope or not.
