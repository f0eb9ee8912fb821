"""torchrun FSDP2 (``fully_shard``) training on CPU with gloo (test fixture).

Run: ``torchrun --nproc_per_node 2 torch_fsdp2.py``. Each rank prints
``RANK <r> STEP <i> <time.perf_counter()>`` after each optimizer step.
"""

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(64, 64), nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
for layer in (model[1], model[3]):
    fully_shard(layer)
fully_shard(model)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(6):
    x = torch.randint(0, 64, (8, 16))
    loss = nn.functional.cross_entropy(model(x).reshape(-1, 64), x.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"RANK {dist.get_rank()} STEP {step} {time.perf_counter():.6f}", flush=True)
dist.destroy_process_group()
