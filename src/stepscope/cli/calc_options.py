"""Flags shared by ``mfu``, ``memory`` and ``plan``: numbers, the model, ``--hf-config``.

Numbers accept ``7e9``, ``7B``, ``7000M``, ``32k``, ``1.5T``. The model is given by shape
flags or by a Hugging Face ``config.json`` (``--hf-config``; ``--seq-len`` and ``--params``
may be added, other shape flags may not: the file is the ground truth).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

from ..calc.model import ModelSpec
from ..errors import ConfigError

__all__ = ["parse_number", "NUMBER", "COUNT", "model_options", "resolve_spec", "SPEC_KEYS",
           "ModelSource"]

F = TypeVar("F", bound=Callable[..., Any])
_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_number(text: str) -> float:
    """'7e9', '7B', '7000M', '32k', '1.5T', '4096' -> float (SI suffixes, 1k = 1000)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([kmbgt]?)\s*", text.lower())
    if not m:
        raise ValueError(f"{text!r} is not a number (examples: 7e9, 7B, 7000M, 32k)")
    return float(m.group(1)) * _SUFFIX[m.group(2)]


class _Number(click.ParamType):  # type: ignore[type-arg]  # generic only since click 8.2
    name = "number"

    def __init__(self, integer: bool = False) -> None:
        self.integer = integer

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float | int:
        if isinstance(value, (int, float)):
            return value
        try:
            number = parse_number(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if self.integer:
            if number != int(number):
                self.fail(f"{value!r} must be a whole number", param, ctx)
            return int(number)
        return number


NUMBER = _Number()
COUNT = _Number(integer=True)

# (flag, ModelSpec field, type, default, help); defaults equal ModelSpec's.
_FLAGS: tuple[tuple[str, str, Any, Any, str], ...] = (
    ("--layers", "layers", COUNT, None, "Transformer layers L."),
    ("--hidden", "hidden", COUNT, None, "Hidden width h."),
    ("--heads", "heads", COUNT, None, "Query heads (default: attention width = hidden)."),
    ("--head-dim", "head_dim", COUNT, None, "Head dimension (MLA: qk_nope_head_dim)."),
    ("--kv-heads", "kv_heads", COUNT, None, "KV heads (GQA/MQA)."),
    ("--ffn-hidden", "ffn_hidden", COUNT, None, "FFN width (default 4h; MoE: dense layers)."),
    ("--vocab", "vocab", COUNT, 0, "Vocabulary size."),
    ("--swiglu", "swiglu", bool, False, "Gated MLP (SwiGLU/GeGLU): 3 matrices."),
    ("--tied-embeddings", "tied_embeddings", bool, False, "LM head shares the embedding."),
    ("--moe-experts", "moe_experts", COUNT, 0, "Routed experts (0: dense)."),
    ("--moe-top-k", "moe_top_k", COUNT, 1, "Experts per token."),
    ("--moe-shared-experts", "moe_shared_experts", COUNT, 0,
     "Shared experts of the routed width."),
    ("--moe-ffn-hidden", "moe_ffn_hidden", COUNT, None,
     "Routed expert width (default --ffn-hidden)."),
    ("--moe-shared-ffn-hidden", "moe_shared_ffn_hidden", COUNT, None,
     "Total shared-expert width, any value (Megatron --moe-shared-expert-intermediate-size)."),
    ("--moe-shared-gate", "moe_shared_gate", bool, False, "Shared-expert gate h x 1 (Qwen2-MoE)."),
    ("--first-k-dense", "first_k_dense", COUNT, 0,
     "MoE models: the first K layers have a dense MLP (DeepSeek first_k_dense_replace)."),
    ("--position-embeddings", "position_embeddings", COUNT, 0,
     "Rows of a learned position table (GPT-2: the context length)."),
    ("--linear-bias", "linear_bias", bool, False, "Biases on every linear layer (GPT-2/NeoX)."),
    ("--qkv-bias", "qkv_bias", bool, False, "Biases on q, k, v only (Qwen2)."),
    ("--norm-bias", "norm_bias", bool, False, "LayerNorm with bias (GPT-2/NeoX)."),
    ("--qk-norm", "qk_norm", bool, False, "RMSNorm over q and k heads (Qwen3)."),
    ("--norms-per-layer", "norms_per_layer", COUNT, 2, "Norms per layer (Gemma2: 4)."),
    ("--q-lora-rank", "q_lora_rank", COUNT, None, "MLA query low rank (none: full q)."),
    ("--kv-lora-rank", "kv_lora_rank", COUNT, 0, "MLA KV low rank (> 0 turns MLA on)."),
    ("--qk-rope-head-dim", "qk_rope_head_dim", COUNT, 0, "MLA decoupled RoPE head dim."),
    ("--v-head-dim", "v_head_dim", COUNT, None, "MLA value head dim."),
    ("--mtp-layers", "mtp_layers", COUNT, 0,
     "Multi-token-prediction modules (DeepSeek-V3: 1), counted as Megatron-LM does."),
    ("--vocab-divisor", "vocab_divisor", COUNT, 1,
     "Pad V to a multiple of this x TP (Megatron --make-vocab-size-divisible-by: 128)."),
)
SPEC_KEYS = ("params", "seq_len", *(f[1] for f in _FLAGS))


def model_options(func: F) -> F:
    """The model flags shared by mfu, memory and plan."""
    options = [
        click.option("--hf-config", type=click.Path(exists=True, dir_okay=False),
                     default=None, help="A Hugging Face config.json (llama, mistral, mixtral, "
                     "qwen2, qwen2_moe, qwen3, qwen3_moe, deepseek_v2/v3, gemma, gemma2, gpt2, "
                     "gpt_neox) instead of the shape flags."),
        click.option("--params", type=NUMBER, default=None,
                     help="Parameter count (overrides the count from the shape)."),
        click.option("--seq-len", type=COUNT, default=None, help="Sequence length T."),
    ]
    for flag, key, kind, default, text in _FLAGS:
        if kind is bool:
            options.append(click.option(flag, key, is_flag=True, help=text))
        else:
            options.append(click.option(flag, key, type=kind, default=default, help=text))
    for option in reversed(options):
        func = option(func)
    return func


class ModelSource:
    """Where the model came from: the flags, or a config file with its used/ignored fields."""

    def __init__(self, path: str | None = None, model_type: str = "", used: list[str] | None
                 = None, ignored: list[str] | None = None, notes: list[str] | None = None,
                 flags: str = "") -> None:
        self.path, self.model_type = path, model_type
        self.used, self.ignored = used or [], ignored or []
        self.notes = notes or []
        self.flags = flags  # the shape flags that reproduce the model (for pasting)
        self.seq_len: int | None = None  # --seq-len given beside --hf-config

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "model_type": self.model_type, "used": self.used,
                "ignored": self.ignored, "notes": self.notes}

    def lines(self) -> list[str]:
        if self.path is None:
            return list(self.notes)
        return [f"model from {self.path} (model_type {self.model_type}): used "
                f"{', '.join(self.used)}", f"ignored: {', '.join(self.ignored) or 'nothing'}",
                *self.notes]


def resolve_spec(kw: dict[str, Any], need_shape: bool = True
                 ) -> tuple[ModelSpec | None, ModelSource]:
    """Build the ModelSpec from the model flags or --hf-config (pops them from ``kw``)."""
    args = {k: kw.pop(k) for k in SPEC_KEYS}
    path = kw.pop("hf_config")
    source = ModelSource()
    if path is not None:
        args, source = _from_hf_config(path, args)
    missing = [k for k in ("layers", "hidden", "seq_len") if args[k] is None]
    if missing:
        if (not need_shape and args["params"] is not None and args["layers"] is None
                and args["hidden"] is None):
            return None, source
        flags = " ".join(f"--{k.replace('_', '-')}" for k in missing)
        raise ConfigError(f"missing {flags}: the attention and activation terms need layers, "
                          "hidden and seq-len (also with --params)")
    if args["params"] is None and args["vocab"] <= 0:
        raise ConfigError("give --params N, or --vocab V with the shape flags to count them")
    source.flags = shape_flags(args)
    return ModelSpec(**args), source


def shape_flags(args: dict[str, Any]) -> str:
    """The shape flags equal to ``args`` (non-default values only), for pasting."""
    parts = []
    if args.get("params") is not None:
        parts.append(f"--params {args['params']:g}")
    if args.get("seq_len") is not None:
        parts.append(f"--seq-len {args['seq_len']}")
    for flag, key, kind, default, _ in _FLAGS:
        value = args.get(key, default)
        if value == default or value is None:
            continue
        parts.append(flag if kind is bool else f"{flag} {value}")
    return " ".join(parts)


def _from_hf_config(path: str, args: dict[str, Any]) -> tuple[dict[str, Any], ModelSource]:
    from ..calc.hf_config import seq_len_default, spec_kwargs

    given = [f for f, key, _, default, _ in _FLAGS if args[key] != default]
    if given:
        raise ConfigError(f"--hf-config describes the model; drop {' '.join(given)} (only "
                          "--seq-len and --params may be added)")
    try:
        config = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"cannot read {path} as JSON: {exc}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a config.json object")
    kwargs, used, ignored = spec_kwargs(config)
    notes = []
    out = {**args, **kwargs}
    if out["seq_len"] is None:
        out["seq_len"] = seq_len_default(config)
        notes.append(f"seq_len {out['seq_len']} from the config's context length; pass "
                     "--seq-len for the training length")
    source = ModelSource(path, str(config.get("model_type")), used, ignored, notes)
    return out, source
