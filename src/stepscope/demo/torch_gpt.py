"""The demo's tiny GPT-style decoder in PyTorch, trained on the CPU and fully measured.

Pre-LayerNorm decoder blocks (causal self-attention via ``scaled_dot_product_attention``,
GELU MLP with 4x width), learned positions, output head tied to the token embedding (as in
GPT-2 / nanoGPT). The training loop records every step through ``stepscope.Recorder``:
data wait (time blocked in the loader), forward, backward, optimizer, loss, accuracy, lr,
gradient norm and memory.

Example::

    from stepscope.demo import torch_gpt
    torch_gpt.train(Path("runs/demo"), steps=50)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .. import Recorder
from ..integrations import torch as sst
from . import data
from .config import GPTConfig, TrainConfig, baseline, lr_at, model_flops

__all__ = ["GPTConfig", "GPT", "TrainConfig", "train", "model_flops"]


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.n_head = cfg.n_head
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model)
        self.out = nn.Linear(4 * cfg.d_model, cfg.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2)
                   for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return out


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied, as GPT-2
        self.apply(self._init)

    @staticmethod
    def _init(m: nn.Module) -> None:
        # GPT-2's initialisation: N(0, 0.02) weights, zero biases. With PyTorch's default
        # N(0, 1) embedding the tied head starts with logits of size ~sqrt(d) and a loss
        # far above ln(vocab).
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits


def _loader(cfg: GPTConfig, tc: TrainConfig, seed: int, slow: bool
            ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    it = (data.slow_batch_iter(None, tc.batch_size, cfg.seq_len, seed) if slow else
          data.batch_iter(data.load_corpus(), tc.batch_size, cfg.seq_len, seed))
    for x, y in it:
        yield torch.from_numpy(x), torch.from_numpy(y)


def replay(batches: list[tuple[torch.Tensor, torch.Tensor]]
           ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless replay of batches held in memory (the synthetic-data substitution)."""
    while True:
        yield from batches


def _meta(cfg: GPTConfig, tc: TrainConfig, model: GPT, seed: int, steps: int,
          slow: bool, extra: dict[str, Any]) -> dict[str, Any]:
    fp = sst.model_fingerprint(model)
    fingerprint = {**fp, **baseline(cfg, tc, seed)}  # the demo names its model
    probe_label = sst.memory_probe("cpu")[1]
    env = {**sst.environment("cpu"), "mem_source": probe_label}
    peak, source = sst.peak_flops_for_device("cpu", "fp32")
    env["peak_flops_source"] = source
    if peak:
        env["peak_flops_per_device"] = peak
    env.update(model_flops(cfg, fp["num_params"]))
    config = {"demo": {"model": asdict(cfg), "train": asdict(tc), "steps": steps,
                       "slow_data": slow, **extra}}
    return {"name": "demo", "baseline": fingerprint, "environment": env, "config": config}


def train(run_dir: Path, *, steps: int, seed: int = 0, slow_data: bool = False,
          on_step: Callable[[dict[str, float]], None] | None = None,
          batches: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
          keep_batches: int = 0, cfg: GPTConfig | None = None,
          tc: TrainConfig | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Train the demo GPT for ``steps`` steps, recording each into ``run_dir``.

    ``batches``: replay these in-memory batches instead of reading data (isolation run).
    ``keep_batches``: return the first K batches seen (for a later replay run).
    """
    cfg, tc = cfg or GPTConfig(), tc or TrainConfig()
    torch.manual_seed(seed)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=tc.lr, weight_decay=tc.weight_decay)
    extra = {"replayed_batches": len(batches)} if batches else {}
    probe, _ = sst.memory_probe("cpu")
    rec = Recorder(run_dir, meta=_meta(cfg, tc, model, seed, steps, slow_data, extra))
    source = replay(batches) if batches else _loader(cfg, tc, seed, slow_data)
    kept: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        for step, (x, y) in enumerate(rec.wrap_loader(source)):
            if step >= steps:
                break
            if len(kept) < keep_batches:
                kept.append((x, y))
            metrics = _train_step(rec, model, opt, x, y, lr_at(step, tc, steps), tc, probe)
            if on_step is not None:
                on_step(metrics)
    except BaseException as exc:
        rec.close(status="failed", error=f"{type(exc).__name__}: {exc}")
        raise
    rec.close()
    return kept


def _train_step(rec: Recorder, model: GPT, opt: torch.optim.Optimizer, x: torch.Tensor,
                y: torch.Tensor, lr: float, tc: TrainConfig,
                probe: Callable[[], tuple[float, float]]) -> dict[str, float]:
    with rec.step(tokens=float(x.numel()), samples=float(x.shape[0])) as s:
        with s.phase("forward"):
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        with s.phase("backward"):
            loss.backward()  # type: ignore[no-untyped-call]
        with s.phase("optimizer"):
            gn = float(torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip))
            for group in opt.param_groups:
                group["lr"] = lr
            opt.step()
            opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            acc = float((logits.argmax(-1) == y).float().mean())
        peak, alloc = probe()
        values = {"loss": float(loss.detach()), "accuracy": acc, "lr": lr, "grad_norm": gn,
                  "mem_peak_bytes": peak, "mem_alloc_bytes": alloc}
        s.log(**values)
    return {**values, "tokens": float(x.numel())}
