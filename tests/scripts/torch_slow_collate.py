"""DataLoader whose collate function sleeps 50 ms per batch (test fixture).

Prints ``STEP <i> <time.perf_counter()>`` after each optimizer step.
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=8)
p.add_argument("--sleep-ms", type=float, default=50.0)
args = p.parse_args()

torch.set_num_threads(1)  # a tiny model: one thread is fastest and steadiest
torch.manual_seed(0)
vocab, d, seq = 64, 32, 16
samples = [torch.randint(0, vocab, (seq + 1,)) for _ in range(args.steps * 4)]


def slow_collate(items):
    time.sleep(args.sleep_ms / 1000.0)
    return torch.stack(items)


loader = DataLoader(samples, batch_size=4, collate_fn=slow_collate)
model = nn.Sequential(nn.Embedding(vocab, d), nn.Linear(d, vocab))
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
for step, batch in enumerate(loader):
    loss = nn.functional.cross_entropy(model(batch[:, :-1]).reshape(-1, vocab),
                                       batch[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad()
    print(f"STEP {step} {time.perf_counter():.6f}", flush=True)
