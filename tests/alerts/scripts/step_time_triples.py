"""Plain PyTorch, no stepscope imports: from step --slow-from on, each step takes 3x longer.

The step is a tiny model's forward/backward/optimizer plus a fixed wait (--base-ms) that
stands for the device work, so the step time is set by the wait, not by how loaded the
shared test machine is; from --slow-from the wait triples (a throttled device, a slower
data path).
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=45)
p.add_argument("--slow-from", type=int, default=30)
p.add_argument("--base-ms", type=float, default=40.0)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
for step in range(args.steps):
    xb = torch.randn(16, 32)
    loss = F.cross_entropy(model(xb), xb[:, :4].argmax(1))
    opt.zero_grad()
    loss.backward()
    time.sleep(args.base_ms / 1000 * (3.0 if step >= args.slow_from else 1.0))
    opt.step()
print(f"done: {args.steps} steps")
