"""torchrun DDP training on CPU with gloo (test fixture; knows nothing of stepscope).

Run: ``torchrun --nproc_per_node 2 torch_ddp.py``. Each rank prints
``RANK <r> STEP <i> <time.perf_counter()>`` after each optimizer step.
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=10)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--seq", type=int, default=64)
p.add_argument("--crash-rank", type=int, default=-1, help="rank that raises ...")
p.add_argument("--crash-step", type=int, default=-1, help="... at the start of this step")
args = p.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(42)
vocab, d = 128, 256
data = torch.randint(0, vocab, (args.steps * args.batch * dist.get_world_size(), args.seq + 1))
sampler = DistributedSampler(TensorDataset(data), shuffle=False)
loader = DataLoader(TensorDataset(data), batch_size=args.batch, sampler=sampler)
# Two linear stages and a small bucket cap, so gradients travel in several buckets.
model = DDP(nn.Sequential(nn.Embedding(vocab, d), nn.Linear(d, 4 * d), nn.GELU(),
                          nn.Linear(4 * d, d), nn.Linear(d, vocab)), bucket_cap_mb=0.25)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step, (batch,) in enumerate(loader):
    if rank == args.crash_rank and step == args.crash_step:
        raise ValueError(f"bad sample on rank {rank}")
    logits = model(batch[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), batch[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"RANK {rank} STEP {step} {time.perf_counter():.6f}", flush=True)
dist.destroy_process_group()
