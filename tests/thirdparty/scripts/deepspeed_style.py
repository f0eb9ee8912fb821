"""A DeepSpeed training script in the style of DeepSpeed's getting-started examples
(third-party fixture).

Written for stepscope's third-party suite: ``deepspeed.initialize`` around a tiny
next-token model and a client ``torch.optim.AdamW``, ZeRO stage ``--stage`` (1 or 2) on
the CPU over gloo (``DS_ACCELERATOR=cpu``), micro-batch 4, gradient accumulation 2
(``engine.backward`` divides the loss by 2, ``engine.step()`` every micro-batch steps the
optimizer every second one), ``gradient_clipping`` 1.0, 12 micro-batches per rank; run
with ``torchrun --nproc_per_node 2``.

Its own numbers, per rank: ``SS step`` at each accumulation boundary (the mean of the
step's micro-batch losses, their count, DeepSpeed's ``get_global_grad_norm()``, lr),
``SS done`` with ``engine.global_steps``.
"""

import argparse

import deepspeed
import torch
import torch.distributed as dist
from torch import nn

VOCAB, SEQ = 64, 16
p = argparse.ArgumentParser()
p.add_argument("--stage", type=int, default=1)
p.add_argument("--local_rank", type=int, default=-1)
args = p.parse_args()


def say(kind, **kv):
    # the line and its newline in one write: ranks share this stdout, unbuffered under torchrun
    print("SS " + kind + "".join(f" {k}={v!r}" for k, v in kv.items()) + "\n", end="", flush=True)


deepspeed.init_distributed(dist_backend="gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(VOCAB, 32), nn.Linear(32, 64), nn.GELU(),
                      nn.Linear(64, VOCAB))
config = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
          "zero_optimization": {"stage": args.stage}, "steps_per_print": 10_000,
          "gradient_clipping": 1.0}
engine, _, _, _ = deepspeed.initialize(
    model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), config=config)
g = torch.Generator().manual_seed(100 + rank)
micro = []
for _ in range(12):
    data = torch.randint(0, VOCAB, (4, SEQ + 1), generator=g)
    loss = nn.functional.cross_entropy(engine(data[:, :-1]).reshape(-1, VOCAB),
                                       data[:, 1:].reshape(-1))
    engine.backward(loss)
    micro.append(loss.item())
    boundary = engine.is_gradient_accumulation_boundary()
    engine.step()
    if boundary:
        say("step", rank=rank, step=engine.global_steps - 1, loss=sum(micro) / len(micro),
            micro=len(micro), grad_norm=float(engine.get_global_grad_norm()),
            lr=engine.get_lr()[0])
        micro = []
say("done", rank=rank, steps=engine.global_steps)
