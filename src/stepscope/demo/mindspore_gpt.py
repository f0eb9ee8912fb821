"""The demo's tiny GPT in MindSpore: the same model and schedule as ``demo/torch_gpt.py``.

Pre-LayerNorm decoder blocks (causal self-attention, GELU MLP with 4x width), learned
positions, output head tied to the token embedding, GPT-2 initialisation (N(0, 0.02)
weights, zero biases); AdamW (decay on every parameter, as the torch demo), linear warm-up
then cosine to 10%, gradient clipping at norm 1. GRAPH mode on the CPU: forward+backward
and the update are two compiled functions. Every step is recorded through
``stepscope.integrations.mindspore.LoopRecorder``: data wait (time blocked in the batch
iterator), ``forward_backward_s`` (``mindspore.value_and_grad`` runs forward and backward in
one compiled call, so they are one phase here), optimizer (clip + update), loss, accuracy,
lr, gradient norm, and the process peak RSS from /proc (labelled so in run.json).

Example::

    from stepscope.demo import mindspore_gpt
    mindspore_gpt.train(Path("runs/demo-ms"), steps=20)
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from ..integrations import mindspore as msi
from . import data
from .config import GPTConfig, TrainConfig, baseline, lr_at, model_flops

__all__ = ["GPTConfig", "TrainConfig", "GPT", "train"]


def _dense(n_in: int, n_out: int) -> nn.Dense:
    init = ms.common.initializer.Normal(sigma=0.02)
    return nn.Dense(n_in, n_out, weight_init=init, bias_init="zeros")


class Block(nn.Cell):  # type: ignore[misc]
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.d = cfg.n_head, cfg.d_model
        self.ln1 = nn.LayerNorm((cfg.d_model,), epsilon=1e-5)
        self.qkv = _dense(cfg.d_model, 3 * cfg.d_model)
        self.proj = _dense(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm((cfg.d_model,), epsilon=1e-5)
        self.fc = _dense(cfg.d_model, 4 * cfg.d_model)
        self.out = _dense(4 * cfg.d_model, cfg.d_model)
        self.gelu = nn.GELU(approximate=False)  # torch F.gelu default: exact erf form
        mask = np.triu(np.full((cfg.seq_len, cfg.seq_len), -1e9, np.float32), k=1)
        self.mask = ms.Tensor(mask)
        self.scale = 1.0 / math.sqrt(cfg.d_model // cfg.n_head)

    def construct(self, x: ms.Tensor) -> ms.Tensor:
        b, t, d = x.shape
        h = self.n_head
        q, k, v = ops.split(self.qkv(self.ln1(x)), d, axis=2)
        q = q.reshape(b, t, h, d // h).transpose(0, 2, 1, 3)
        k = k.reshape(b, t, h, d // h).transpose(0, 2, 3, 1)
        v = v.reshape(b, t, h, d // h).transpose(0, 2, 1, 3)
        att = ops.softmax(ops.matmul(q, k) * self.scale + self.mask[:t, :t], axis=-1)
        y = ops.matmul(att, v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.out(self.gelu(self.fc(self.ln2(x))))


class GPT(nn.Cell):  # type: ignore[misc]
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        init = ms.common.initializer.Normal(sigma=0.02)
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model, embedding_table=init)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model, embedding_table=init)
        self.blocks = nn.CellList([Block(cfg) for _ in range(cfg.n_layer)])
        self.ln_f = nn.LayerNorm((cfg.d_model,), epsilon=1e-5)
        self.positions = ms.Tensor(np.arange(cfg.seq_len, dtype=np.int32))

    def construct(self, idx: ms.Tensor) -> ms.Tensor:
        x = self.tok(idx) + self.pos(self.positions[: idx.shape[1]])
        for block in self.blocks:
            x = block(x)
        # head tied to the token embedding (GPT-2): logits = h @ E^T
        return ops.matmul(self.ln_f(x), self.tok.embedding_table.T)


def _meta(cfg: GPTConfig, tc: TrainConfig, net: GPT, seed: int, steps: int,
          slow: bool) -> dict[str, Any]:
    fp = msi.model_fingerprint(net)
    fingerprint = {**fp, **baseline(cfg, tc, seed)}  # the demo names its model
    env: dict[str, Any] = model_flops(cfg, fp["num_params"])
    config = {"demo": {"model": asdict(cfg), "train": asdict(tc), "steps": steps,
                       "slow_data": slow, "framework": "mindspore"}}
    return {"name": "demo-mindspore", "baseline": fingerprint, "environment": env,
            "config": config}


def _compiled_step(net: GPT, opt: nn.Optimizer, tc: TrainConfig, vocab: int
                   ) -> tuple[Callable[..., Any], Callable[..., Any]]:
    ce = nn.CrossEntropyLoss()

    def loss_fn(x: ms.Tensor, y: ms.Tensor) -> tuple[ms.Tensor, ms.Tensor]:
        logits = net(x)
        return ce(logits.reshape(-1, vocab), y.reshape(-1)), logits

    grad_fn = ms.value_and_grad(loss_fn, None, opt.parameters, has_aux=True)

    @ms.jit
    def forward_backward(x, y):  # type: ignore[no-untyped-def]
        (loss, logits), grads = grad_fn(x, y)
        acc = (logits.argmax(-1) == y).astype(ms.float32).mean()
        return loss, acc, grads

    @ms.jit
    def update(grads):  # type: ignore[no-untyped-def]
        # clip to global norm tc.grad_clip, as torch's clip_grad_norm_ (eps 1e-6)
        norm = ops.sqrt(ops.addn([ops.sum(ops.square(g)) for g in grads]))
        scale = ops.clamp(tc.grad_clip / (norm + 1e-6), max=1.0)
        opt(tuple(g * scale for g in grads))
        return norm

    return forward_backward, update


def _batches(cfg: GPTConfig, tc: TrainConfig, seed: int, slow: bool
             ) -> Iterator[tuple[ms.Tensor, ms.Tensor]]:
    it = (data.slow_batch_iter(None, tc.batch_size, cfg.seq_len, seed) if slow else
          data.batch_iter(data.load_corpus(), tc.batch_size, cfg.seq_len, seed))
    for x, y in it:
        yield ms.Tensor(x.astype(np.int32)), ms.Tensor(y.astype(np.int32))


def train(run_dir: Path, *, steps: int, seed: int = 0, slow_data: bool = False,
          on_step: Callable[[dict[str, float]], None] | None = None,
          cfg: GPTConfig | None = None, tc: TrainConfig | None = None,
          profile_steps: tuple[int, int] | None = None,
          batches: list[tuple[ms.Tensor, ms.Tensor]] | None = None,
          keep_batches: int = 0) -> list[tuple[ms.Tensor, ms.Tensor]]:
    """Train the demo GPT for ``steps`` steps in MindSpore, recording each into ``run_dir``.

    ``batches``: replay these in-memory batches instead of reading data (isolation run).
    ``keep_batches``: return the first K batches seen (for a later replay run).
    """
    cfg, tc = cfg or GPTConfig(), tc or TrainConfig()
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    ms.set_seed(seed)
    net = GPT(cfg)
    lrs = [lr_at(i, tc, steps) for i in range(max(steps, 1))]
    opt = nn.AdamWeightDecay([{"params": net.trainable_params(),
                               "weight_decay": tc.weight_decay}], learning_rate=lrs)
    forward_backward, update = _compiled_step(net, opt, tc, cfg.vocab_size)
    rec = msi.LoopRecorder(run_dir, network=net, optimizer=opt,
                           meta=_meta(cfg, tc, net, seed, steps, slow_data),
                           profile_steps=profile_steps)
    source = (itertools.cycle(batches) if batches else _batches(cfg, tc, seed, slow_data))
    kept: list[tuple[ms.Tensor, ms.Tensor]] = []
    try:
        for i, (x, y) in enumerate(rec.wrap_loader(source)):
            if i >= steps:
                break
            if len(kept) < keep_batches:
                kept.append((x, y))
            with rec.step(x) as s:
                with s.phase("forward_backward"):
                    loss, acc, grads = forward_backward(x, y)
                    loss_v = float(loss.asnumpy())
                with s.phase("optimizer"):
                    gn = float(update(ms.mutable(grads)).asnumpy())
                values = {"accuracy": float(acc.asnumpy()), "grad_norm": gn}
                rec.log(loss=loss_v, accuracy=values["accuracy"], grad_norm=gn)
            if on_step is not None:
                on_step({"loss": loss_v, **values, "lr": lrs[i],
                         "tokens": float(x.shape[0] * x.shape[1])})
    except BaseException as exc:
        rec.close(status="failed", error=f"{type(exc).__name__}: {exc}")
        raise
    rec.close()
    return kept
