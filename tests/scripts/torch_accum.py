"""Own training loop without a DataLoader, gradient accumulation 4 (test fixture).

nanoGPT-style ``get_batch``; the loss is divided by the accumulation count before
backward. Prints ``STEP <i> <time.perf_counter()>`` after each optimizer step.
"""

import argparse
import time

import torch
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=6)
p.add_argument("--accum", type=int, default=4)
p.add_argument("--batch", type=int, default=4)
p.add_argument("--seq", type=int, default=32)
args = p.parse_args()

torch.manual_seed(7)
vocab, d = 64, 64
corpus = torch.randint(0, vocab, (10_000,))


def get_batch():
    ix = torch.randint(0, len(corpus) - args.seq - 1, (args.batch,))
    x = torch.stack([corpus[i:i + args.seq] for i in ix])
    y = torch.stack([corpus[i + 1:i + args.seq + 1] for i in ix])
    return x, y


model = nn.Sequential(nn.Embedding(vocab, d), nn.Linear(d, d), nn.ReLU(), nn.Linear(d, vocab))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
for step in range(args.steps):
    for _ in range(args.accum):
        x, y = get_batch()
        logits = model(x)
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        (loss / args.accum).backward()
    opt.step()
    opt.zero_grad()
    print(f"STEP {step} {time.perf_counter():.6f}", flush=True)
