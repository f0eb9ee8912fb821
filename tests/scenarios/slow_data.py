"""Scenario: the data pipeline starves training. Plain PyTorch, no stepscope imports.

Every sample goes through a slow "tokenization" in the main process (num_workers=0), the
field report's serial preprocessing: ~0.3 ms per sample, ~20 ms per batch of 64, several
times the compute of a step. Diagnose must name data_pipeline; `stepscope isolate data`
must show the throughput gap.
"""

import argparse
import time

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=80)
p.add_argument("--ms-per-sample", type=float, default=0.3)
args = p.parse_args()

torch.manual_seed(0)
torch.set_num_threads(1)


class SlowText(Dataset):
    def __init__(self, n: int) -> None:
        self.x = torch.randn(n, 64)
        self.y = (self.x @ torch.randn(64, 8)).argmax(1)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        time.sleep(args.ms_per_sample / 1000)  # serial preprocessing / tokenization
        return self.x[i], self.y[i]


loader = DataLoader(SlowText(8192), batch_size=64, shuffle=True, drop_last=True)
model = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 8))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
step = 0
while step < args.steps:
    for xb, yb in loader:
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        step += 1
        if step >= args.steps:
            break
print(f"done: {step} steps, last loss {loss.item():.4f}")
