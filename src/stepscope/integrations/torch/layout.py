"""What a model's structure says about its inputs and its FLOPs (read once per model).

* Batch layout: token ids are taken as ``[batch, seq]`` unless the model's own layers say
  otherwise: torch.nn recurrent and attention layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``,
  ``nn.MultiheadAttention``, ``nn.Transformer*Layer``) with ``batch_first=False`` -- their
  default, as in pytorch/examples word_language_model -- and none with ``batch_first=True``
  mean ``[seq, batch]``; samples are then the inputs' second dimension.
* Transformer shape: layers, heads, hidden width, vocabulary, read from ``model.config``
  under the names Hugging Face configs and nanoGPT's ``GPTConfig`` use, so that a named
  FLOPs convention with an attention term (``palm``, ``megatron``) can be computed for
  the run; ``position_params`` are the lookup tables that are not the vocabulary's.
* Embedding lookups: the weights of ``nn.Embedding`` / ``nn.EmbeddingBag`` tables that no
  other module uses (an untied input embedding, a learned position table) do no matmul
  work, so the default FLOPs count (6 per matmul parameter per token) leaves them out; a
  table tied to the output projection is that projection's matmul and stays counted.
"""

from __future__ import annotations

from typing import Any

from ...calc.hf_config import FAMILIES, spec_kwargs

__all__ = ["sequence_first", "lookup_only_params", "transformer_shape"]

_LAYOUT_LAYERS = ("RNN", "LSTM", "GRU", "MultiheadAttention", "TransformerEncoderLayer",
                  "TransformerDecoderLayer", "Transformer")


def sequence_first(model: Any) -> str | None:
    """Why ``model`` takes ``[seq, batch]`` inputs (e.g. ``"nn.LSTM rnn: batch_first=False"``),
    or None when nothing says so (the batch-first default)."""
    seq_first: str | None = None
    for name, m in model.named_modules():
        cls = type(m)
        if cls.__name__ not in _LAYOUT_LAYERS or not cls.__module__.startswith("torch.nn"):
            continue
        bf = getattr(m, "batch_first", None)
        if bf is True:
            return None
        if bf is False and seq_first is None:
            seq_first = f"nn.{cls.__name__} {name or '(model)'}: batch_first=False"
    return seq_first


def lookup_only_params(model: Any) -> int:
    """Parameters of embedding tables that no other module uses (see module docstring)."""
    tables: dict[int, int] = {}
    used_elsewhere: set[int] = set()
    for m in model.modules():
        own = list(m.parameters(recurse=False))
        if type(m).__name__ in ("Embedding", "EmbeddingBag") and \
                type(m).__module__.startswith("torch.nn"):
            w = getattr(m, "weight", None)
            if w is not None:
                tables[id(w)] = int(w.numel())
            continue
        used_elsewhere.update(id(p) for p in own)
    return sum(n for key, n in tables.items() if key not in used_elsewhere)


# model.config attribute names, Hugging Face first, then nanoGPT's GPTConfig
_SHAPE_NAMES = {
    "layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "heads": ("num_attention_heads", "n_head", "n_heads"),
    "hidden": ("hidden_size", "n_embd", "d_model", "dim"),
    "vocab": ("vocab_size",),
    "kv_heads": ("num_key_value_heads", "n_kv_head", "n_kv_heads"),
    "ffn_hidden": ("intermediate_size", "n_inner", "ffn_dim"),
}


# ModelSpec fields a transformers config gives through the calculator's family mappers
# (stepscope.calc.hf_config), kept as plain ints in run.json's baseline ("model_shape").
_FAMILY_KEYS = ("layers", "heads", "hidden", "vocab", "kv_heads", "ffn_hidden", "head_dim",
                "swiglu", "moe_experts", "moe_top_k", "moe_shared_experts", "moe_ffn_hidden",
                "moe_shared_ffn_hidden", "first_k_dense", "kv_lora_rank", "q_lora_rank",
                "qk_rope_head_dim", "v_head_dim")


def _family_shape(cfg: Any) -> dict[str, int]:
    """The shape of a transformers model of a family ``--hf-config`` knows (llama, qwen,
    mixtral, deepseek, gpt2, ...), read by the same mapper; {} for any other config."""
    to_dict = getattr(cfg, "to_dict", None)
    if not callable(to_dict):
        return {}
    try:
        config = to_dict()
        if not isinstance(config, dict) or str(config.get("model_type")) not in FAMILIES:
            return {}
        kwargs, _, _ = spec_kwargs(config)
    except Exception:  # a config the mapper cannot read: the attribute names below instead
        return {}
    return {k: int(v) for k, v in kwargs.items()
            if k in _FAMILY_KEYS and isinstance(v, (int, bool)) and v is not None}


def transformer_shape(model: Any) -> dict[str, int] | None:
    """``{layers, heads, hidden, vocab[, kv_heads, ffn_hidden, ...], position_params}`` from
    ``model.config``: through the calculator's family mapper for a transformers model (MoE,
    MLA and SwiGLU fields too), else by attribute name (nanoGPT's ``GPTConfig`` and the
    like); None when layers, heads or hidden width are not named there."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return None
    out = _family_shape(cfg)
    for key, names in _SHAPE_NAMES.items():
        for name in names if key not in out else ():
            v = getattr(cfg, name, None)
            if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                out[key] = v
                break
    if not {"layers", "heads", "hidden"} <= out.keys():
        return None
    out["position_params"] = _position_params(model, out.get("vocab", 0))
    return out


def _position_params(model: Any, vocab: int) -> int:
    """Parameters of lookup tables whose row count is not the vocabulary (position tables)."""
    n = 0
    for m in model.modules():
        if type(m).__name__ == "Embedding" and type(m).__module__.startswith("torch.nn"):
            if m.num_embeddings != vocab:
                n += int(m.weight.numel())
    return n
