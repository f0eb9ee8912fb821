"""The demo's model and training configuration, shared by the PyTorch and MindSpore demos.

Framework-free: both ``torch_gpt`` and ``mindspore_gpt`` build the same GPT from
``GPTConfig``, train it with ``TrainConfig`` and the schedule ``lr_at``, and describe it to
the FLOPs calculator with ``model_flops``, so the two runs are comparable number for number.

Example::

    cfg, tc = GPTConfig(), TrainConfig()
    lr_at(0, tc, total=100)           # 1e-4: first warm-up step
"""

from __future__ import annotations

import dataclasses
import math
import platform
from dataclasses import dataclass
from typing import Any

from . import data

__all__ = ["GPTConfig", "TrainConfig", "lr_at", "model_flops", "baseline"]


@dataclass(frozen=True)
class GPTConfig:
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    seq_len: int = 256
    vocab_size: int = data.VOCAB_SIZE


@dataclass(frozen=True)
class TrainConfig:
    batch_size: int = 8
    lr: float = 1e-3
    warmup_steps: int = 10
    weight_decay: float = 0.1
    grad_clip: float = 1.0


def lr_at(step: int, tc: TrainConfig, total: int) -> float:
    """Linear warm-up then cosine decay to 10% of the peak."""
    if step < tc.warmup_steps:
        return tc.lr * (step + 1) / tc.warmup_steps
    frac = (step - tc.warmup_steps) / max(1, total - tc.warmup_steps)
    return tc.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def model_flops(cfg: GPTConfig, n_params: int) -> dict[str, Any]:
    """FLOPs per token of the demo model under the default (PaLM) convention, for run.json.

    Delegates to ``stepscope.calc.flops`` with the model's exact shape (learned positions,
    biases, tied head), and checks the shape's parameter count against the real one.
    """
    from ..calc.flops import ModelSpec, flops_per_token

    spec = ModelSpec(layers=cfg.n_layer, hidden=cfg.d_model, heads=cfg.n_head,
                     ffn_hidden=4 * cfg.d_model, vocab=cfg.vocab_size, seq_len=cfg.seq_len,
                     tied_embeddings=True, position_embeddings=cfg.seq_len,
                     linear_bias=True, norm_bias=True)
    if int(spec.num_params()) != n_params:  # the spec no longer describes the model
        spec = dataclasses.replace(spec, params=n_params)
    est = flops_per_token(spec)
    return {"flops_per_token": est.flops_per_token,
            "hardware_flops_per_token": est.hardware_flops_per_token,
            "flops_convention": est.convention}


def baseline(cfg: GPTConfig, tc: TrainConfig, seed: int) -> dict[str, Any]:
    """The demo's baseline fingerprint (run.json), the same for both frameworks; the
    adapter adds what it reads off the model (parameter count, structure hash)."""
    return {
        "model_name": "stepscope-demo-gpt", "num_layers": cfg.n_layer,
        "hidden_size": cfg.d_model, "num_heads": cfg.n_head, "seq_len": cfg.seq_len,
        "vocab_size": cfg.vocab_size, "dataset": "python-stdlib-sources",
        "dataset_version": f"python-{platform.python_version()}",
        "packing": "random windows", "shuffle": True, "num_devices": 1,
        "device_kind": "cpu", "parallel_strategy": "single", "dp": 1, "tp": 1, "pp": 1,
        "zero_stage": 0, "global_batch": tc.batch_size, "micro_batch": tc.batch_size,
        "grad_accum": 1, "optimizer": "adamw", "lr": tc.lr,
        "warmup_steps": tc.warmup_steps, "lr_schedule": "linear warmup + cosine to 10%",
        "weight_decay": tc.weight_decay, "precision": "fp32", "recompute": "none",
        "seed": seed,
    }
