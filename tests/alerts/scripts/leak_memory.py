"""Plain PyTorch, no stepscope imports: each step makes a 4 MiB tensor; with --leak it is
kept in a list that grows for the whole run (the classic leak: a list of tensors kept
across steps), without it the tensor is dropped at the end of the step."""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=90)
p.add_argument("--leak", action="store_true")
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
kept = []
for _ in range(args.steps):
    xb = torch.randn(16, 32)
    loss = F.cross_entropy(model(xb), xb[:, :4].argmax(1))
    opt.zero_grad()
    loss.backward()
    scratch = torch.randn(1 << 20)  # 4 MiB of float32, every page written
    if args.leak:
        kept.append(scratch)
    del scratch
    time.sleep(0.02)
    opt.step()
print(f"done: {args.steps} steps, {len(kept)} tensors kept")
