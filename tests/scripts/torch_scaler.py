"""Loop with torch.amp.GradScaler on the CPU; step 3's gradients are made infinite
(test fixture). Prints ``STEP <i> <time.perf_counter()> loss=<unscaled loss>``."""

import time

import torch
from torch import nn

torch.manual_seed(11)
model = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
for step in range(6):
    x = torch.randint(0, 32, (4, 8))
    loss = nn.functional.cross_entropy(model(x).reshape(-1, 32), x.reshape(-1))
    scaler.scale(loss).backward()
    if step == 3:
        model[1].weight.grad[0, 0] = float("inf")
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    print(f"STEP {step} {time.perf_counter():.6f} loss={loss.item():.6f}", flush=True)
