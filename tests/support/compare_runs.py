"""Real run directories for the compare/index tests: tiny torch models trained on CPU.

How the runs are made: a next-token MLP (embedding 64x32 over a 16-token context, one
hidden layer of 512) on a fixed random token stream, trained with SGD and recorded with
``stepscope.Recorder`` (forward/backward/optimizer phases, data wait through
``wrap_loader``, loss per step). All runs of a set train *interleaved*, one step of each in
a shuffled order, so that background load on a shared machine hits every run alike; this is
what makes "the same configuration twice" a fair noise test. The slowed run's loader
sleeps ``slow_s`` before each batch (a starving input pipeline).
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import stepscope

VOCAB = 64
CONTEXT = 16
HIDDEN = 512


@dataclass(frozen=True)
class Spec:
    name: str
    batch: int = 16
    lr: float = 0.05
    seed: int = 0
    slow_s: float = 0.0


def _baseline(spec: Spec) -> dict[str, Any]:
    return {
        "model_name": "tiny-mlp-lm", "num_layers": 2, "hidden_size": HIDDEN,
        "seq_len": CONTEXT, "vocab_size": VOCAB, "dataset": "random-tokens-v1",
        "num_devices": 1, "device_kind": "cpu", "parallel_strategy": "none",
        "global_batch": spec.batch, "micro_batch": spec.batch, "grad_accum": 1,
        "optimizer": "sgd", "lr": spec.lr, "warmup_steps": 0, "precision": "fp32",
        "recompute": "none", "seed": spec.seed,
    }


def _loader(torch: Any, spec: Spec, steps: int) -> Iterator[tuple[Any, Any]]:
    gen = torch.Generator().manual_seed(1234 + spec.seed)
    stream = torch.randint(0, VOCAB, (4096,), generator=gen)
    stream = (stream * 7 + torch.arange(4096)) % VOCAB  # learnable structure
    for _ in range(steps):
        starts = torch.randint(0, 4096 - CONTEXT - 1, (spec.batch,), generator=gen)
        idx = starts[:, None] + torch.arange(CONTEXT + 1)
        window = stream[idx]
        if spec.slow_s:
            time.sleep(spec.slow_s)
        yield window[:, :CONTEXT], window[:, CONTEXT]


class _Run:
    def __init__(self, torch: Any, root: Path, spec: Spec, steps: int) -> None:
        torch.manual_seed(spec.seed)
        nn = torch.nn
        self.spec = spec
        self.model = nn.Sequential(nn.Embedding(VOCAB, 32), nn.Flatten(),
                                   nn.Linear(32 * CONTEXT, HIDDEN), nn.ReLU(),
                                   nn.Linear(HIDDEN, VOCAB))
        self.opt = torch.optim.SGD(self.model.parameters(), lr=spec.lr)
        self.loss_fn = nn.CrossEntropyLoss()
        self.rec = stepscope.Recorder(
            root / spec.name, rank=0, background=False,
            meta={"name": spec.name, "baseline": _baseline(spec),
                  "environment": {"framework": "torch",
                                  "framework_version": torch.__version__}})
        self.batches = self.rec.wrap_loader(_loader(torch, spec, steps))

    def one_step(self) -> None:
        x, y = next(self.batches)
        with self.rec.step(tokens=x.numel(), samples=x.shape[0]) as s:
            with s.phase("forward"):
                loss = self.loss_fn(self.model(x), y)
            with s.phase("backward"):
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
            with s.phase("optimizer"):
                self.opt.step()
            s.log(loss=loss.item())


def train_interleaved(root: Path, specs: list[Spec], steps: int) -> dict[str, Path]:
    """Train every spec for ``steps`` steps, interleaved; returns name -> run directory."""
    import torch

    torch.set_num_threads(1)
    runs = [_Run(torch, root, spec, steps) for spec in specs]
    order = random.Random(0)
    for _ in range(steps):
        for run in order.sample(runs, len(runs)):
            run.one_step()
    for run in runs:
        run.rec.close()
    return {spec.name: root / spec.name for spec in specs}
