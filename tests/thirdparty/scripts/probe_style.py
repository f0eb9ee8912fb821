"""A plain PyTorch training script that checks its model before training (third-party
fixture, in the style of tutorials that print ``model(x).shape`` first).

Written for stepscope's third-party suite: the first batch is drawn from the DataLoader,
then the model's output shape is checked twice under ``torch.no_grad()`` on a large dummy
batch, once in train mode and once in ``model.eval()`` (as torchinfo or a model summary
does), then 6 AdamW steps run over the DataLoader, the first on that first batch.

Its own numbers: ``SS probe`` per check (seconds, mode), ``SS step`` per optimizer step
(loss, perf_counter at the step's start and end), ``SS done``.
"""

import time

import torch
from torch import nn

VOCAB, SEQ = 64, 16


def say(kind, **kv):
    # the line and its newline in one write: ranks share this stdout, unbuffered under torchrun
    print("SS " + kind + "".join(f" {k}={v!r}" for k, v in kv.items()) + "\n", end="", flush=True)


torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(VOCAB, 64), nn.Linear(64, 256), nn.GELU(),
                      nn.Linear(256, VOCAB))
data = torch.randint(0, VOCAB, (48, SEQ + 1), generator=torch.Generator().manual_seed(1))
loader = torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(data[:, :-1], data[:, 1:]), batch_size=8)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

batches = iter(loader)
first = next(batches)
dummy = torch.zeros(4096, SEQ, dtype=torch.long)
for mode in ("train", "eval"):
    model.train(mode == "train")
    t = time.perf_counter()
    with torch.no_grad():
        for _ in range(3):
            shape = tuple(model(dummy).shape)
    say("probe", seconds=time.perf_counter() - t, mode=mode, shape=shape)
model.train()

step = 0
for x, y in [first, *batches]:
    t0 = time.perf_counter()
    loss = nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))
    opt.zero_grad()
    loss.backward()
    opt.step()
    say("step", step=step, loss=loss.item(), t0=t0, t=time.perf_counter())
    step += 1
say("done", steps=step)
