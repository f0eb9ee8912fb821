"""Plain PyTorch, no stepscope imports: step --hang-at blocks for --hang-s seconds in a
call that stands for a read from stalled storage (the field report's night of retries)."""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--hang-at", type=int, default=8)
p.add_argument("--hang-s", type=float, default=30.0)
args = p.parse_args()


def read_from_stalled_storage(seconds: float) -> None:
    time.sleep(seconds)


torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
for step in range(args.steps):
    xb = torch.randn(16, 32)
    if step == args.hang_at:
        read_from_stalled_storage(args.hang_s)
    loss = F.cross_entropy(model(xb), xb[:, :4].argmax(1))
    opt.zero_grad()
    loss.backward()
    time.sleep(0.01)
    opt.step()
print(f"done: {args.steps} steps")
