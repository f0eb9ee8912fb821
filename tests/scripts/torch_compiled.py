"""torch.compile'd model (aot_eager backend: no C++ toolchain needed) (test fixture).

Prints ``STEP <i> <time.perf_counter()> loss=<loss>`` after each optimizer step.
"""

import time

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64))
compiled = torch.compile(model, backend="aot_eager")
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(5):
    x = torch.randint(0, 64, (4, 8))
    loss = nn.functional.cross_entropy(compiled(x).reshape(-1, 64), x.reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"STEP {step} {time.perf_counter():.6f} loss={loss.item():.6f}", flush=True)
