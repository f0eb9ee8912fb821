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

__all__ = ["sequence_first", "lookup_only_params", "six_n_matmul", "transformer_shape"]

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


# model.config attribute names, Hugging Face first, then nanoGPT's GPTConfig
_SHAPE_NAMES = {
    "layers": ("num_hidden_layers", "n_layer", "n_layers", "num_layers"),
    "heads": ("num_attention_heads", "n_head", "n_heads"),
    "hidden": ("hidden_size", "n_embd", "d_model", "dim"),
    "vocab": ("vocab_size",),
    "kv_heads": ("num_key_value_heads", "n_kv_head", "n_kv_heads"),
    "ffn_hidden": ("intermediate_size", "n_inner", "ffn_dim"),
}


def transformer_shape(model: Any) -> dict[str, int] | None:
    """``{layers, heads, hidden, vocab[, kv_heads, ffn_hidden], position_params}`` from
    ``model.config``, or None when layers, heads or hidden width are not named there."""
    cfg = getattr(model, "config", None)
    if cfg is None:
        return None
    out: dict[str, int] = {}
    for key, names in _SHAPE_NAMES.items():
        for name in names:
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
