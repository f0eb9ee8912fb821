"""What a model's structure says about its inputs and its FLOPs (read once per model).

* Batch layout: token ids are taken as ``[batch, seq]`` unless the model's own layers say
  otherwise: torch.nn recurrent and attention layers (``nn.LSTM``, ``nn.GRU``, ``nn.RNN``,
  ``nn.MultiheadAttention``, ``nn.Transformer*Layer``) with ``batch_first=False`` -- their
  default, as in pytorch/examples word_language_model -- and none with ``batch_first=True``
  mean ``[seq, batch]``; samples are then the inputs' second dimension.
* Embedding lookups: the weights of ``nn.Embedding`` / ``nn.EmbeddingBag`` tables that no
  other module uses (an untied input embedding, a learned position table) do no matmul
  work, so the default FLOPs count (6 per matmul parameter per token) leaves them out; a
  table tied to the output projection is that projection's matmul and stays counted.
"""

from __future__ import annotations

from typing import Any

__all__ = ["sequence_first", "lookup_only_params", "six_n_matmul"]

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
