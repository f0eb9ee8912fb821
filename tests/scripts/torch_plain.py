"""Plain PyTorch training loop (test fixture for `stepscope run`; knows nothing of stepscope).

A tiny next-token model on random token ids, DataLoader + AdamW + clip_grad_norm_.
Prints one line per optimizer step: ``STEP <i> <time.perf_counter()>``.
"""

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=12)
p.add_argument("--batch", type=int, default=16)
p.add_argument("--seq", type=int, default=128)
args = p.parse_args()

torch.manual_seed(1234)
vocab, d = 128, 256
data = torch.randint(0, vocab, (args.steps * args.batch, args.seq + 1))
loader = DataLoader(TensorDataset(data), batch_size=args.batch, shuffle=False)
model = nn.Sequential(nn.Embedding(vocab, d), nn.Linear(d, 4 * d), nn.GELU(),
                      nn.Linear(4 * d, d), nn.Linear(d, vocab))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1)

for step, (batch,) in enumerate(loader):
    x, y = batch[:, :-1], batch[:, 1:]
    logits = model(x)
    loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    print(f"STEP {step} {time.perf_counter():.6f} loss={loss.item():.6f}", flush=True)
