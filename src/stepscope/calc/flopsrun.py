"""FLOPs per token of a recorded run under each named convention (``run`` and ``report
--flops-convention NAME``).

The run records the model's parameter count, its embedding-lookup parameters and, when
``model.config`` names them, layers, heads, hidden width and vocabulary (the torch
adapter's ``layout``). Pure arithmetic over those numbers: :func:`by_convention` gives
every convention that can be computed: ``matmul`` (the default: 6 x matmul parameters,
lookups left out) always, and the calculator's ``palm``, ``torchtitan``, ``6n`` and the
Megatron ones when the shape allows (:func:`stepscope.calc.flops.flops_per_token`; palm's
N = every parameter except position tables, as nanoGPT's ``estimate_mfu``).

Example::

    table = by_convention(num_params=27520 + 512, lookups=512, seq_len=16,
                          shape={"layers": 2, "heads": 2, "hidden": 32, "vocab": 64,
                                 "position_params": 512})
    table["palm"]["flops_per_token"]      # 6 * 27520 + 12 * 2 * 32 * 16 = 177408
"""

from __future__ import annotations

from typing import Any

from ..errors import ConfigError
from .flops import CONVENTIONS, flops_per_token
from .model import ModelSpec

__all__ = ["DEFAULT", "NAMES", "by_convention", "choose", "six_n_matmul"]

DEFAULT = "matmul"
# What `stepscope run --flops-convention` accepts; "counted": the model's own forward FLOPs
# x 3, counted by FlopCounterMode (flopcount.py), for any network (CNNs and MLPs too).
NAMES = (DEFAULT, "counted", *CONVENTIONS)
# ModelSpec fields beyond the basic shape that a run's "model_shape" may carry.
_EXTRA = ("head_dim", "swiglu", "moe_experts", "moe_top_k", "moe_shared_experts",
          "moe_ffn_hidden", "moe_shared_ffn_hidden", "first_k_dense", "kv_lora_rank",
          "q_lora_rank", "qk_rope_head_dim", "v_head_dim")


def six_n_matmul(num_params: int, lookups: int) -> dict[str, Any]:
    """run.json FLOPs fields of the default convention: 6 x matmul parameters per token.

    Forward 2 FLOPs per weight per token (a multiply-add), backward 4 (gradients of input
    and weight); no attention-core term, no recompute, so HFU equals MFU. Embedding
    lookups (``lookups`` parameters) do no matmul work and are left out.
    """
    n = num_params - lookups
    return {"flops_per_token": 6.0 * n, "hardware_flops_per_token": 6.0 * n,
            "flops_matmul_params": n,
            "flops_convention": (f"6N over matmul parameters (N = {n:,}; {lookups:,} "
                                 "embedding-lookup parameters left out), no attention term, "
                                 "no recompute")}


def by_convention(num_params: int, lookups: int, seq_len: int | None,
                  shape: dict[str, int] | None) -> dict[str, dict[str, Any]]:
    """``{convention: run.json FLOPs fields}`` for every convention computable here."""
    out: dict[str, dict[str, Any]] = {DEFAULT: six_n_matmul(num_params, lookups)}
    if not shape or not seq_len:
        return out
    position = shape.get("position_params", 0)
    tied = lookups <= position  # the vocabulary table is not lookup-only: tied to the head
    for name in CONVENTIONS:
        params = None if name.startswith("megatron") else float(num_params - position)
        try:
            extra: dict[str, Any] = {k: shape[k] for k in _EXTRA if k in shape}  # a family's
            if "swiglu" in extra:  # fields, from layout's use of calc.hf_config
                extra["swiglu"] = bool(extra["swiglu"])
            spec = ModelSpec(layers=shape["layers"], hidden=shape["hidden"], seq_len=seq_len,
                             heads=shape["heads"], kv_heads=shape.get("kv_heads"),
                             ffn_hidden=shape.get("ffn_hidden"), vocab=shape.get("vocab", 0),
                             tied_embeddings=tied, params=params, **extra)
            est = flops_per_token(spec, name)
        except (ConfigError, ValueError, ZeroDivisionError):
            continue  # this convention needs what the model's config does not say
        out[name] = {"flops_per_token": est.flops_per_token,
                     "hardware_flops_per_token": est.hardware_flops_per_token,
                     "flops_convention": f"{name}: {est.formula} ({est.source})"}
    return out


def choose(table: dict[str, dict[str, Any]], name: str) -> dict[str, Any]:
    """The fields of convention ``name``; ConfigError naming the computable ones if absent."""
    if name in table:
        return table[name]
    known = ", ".join(sorted(table))
    raise ConfigError(f"FLOPs convention {name!r} cannot be computed for this run (it needs "
                      f"the model's layers, heads and hidden width from model.config); "
                      f"available: {known}")
