"""Activation memory per device, after Korthikanti et al. 2022 ("Reducing Activation
Recomputation in Large Transformer Models", Table 2 and Sec. 4).

Per transformer layer, 16-bit activations and 1-byte dropout masks, s sequence, b micro-batch,
h hidden, a heads, t tensor-parallel size (bytes)::

    no recompute, no TP        s*b*h*(34 + 5*a*s/h)
    TP                         s*b*h*(10 + 24/t + 5*a*s/(h*t))
    TP + sequence parallel     s*b*h/t*(34 + 5*a*s/h)
    selective (core attention recomputed): the 5*a*s^2*b term goes
    full recompute             2*s*b*h  (the layer input only; /t with sequence parallel)

where 10*s*b*h is what TP alone leaves replicated (two LayerNorm inputs 4sbh, the QKV and MLP
inputs 4sbh, two dropout masks 2sbh), 24*s*b*h/t the TP-sharded tensors (Q, K, V, the
projection input 8sbh; the MLP's 4h-wide GeLU input and output 16sbh) and 5*a*s^2*b the
attention core (softmax output 2, dropout mask 1, dropout output 2 bytes per score).
Generalised here term by term: K and V scale with the KV width (GQA), the MLP terms with f
(f = 4h gives 16sbh), SwiGLU keeps the fused gate+up output and the down-projection input
(6*s*b*f, Megatron's fused bias-SwiGLU), MoE multiplies the MLP terms by the experts each
token visits. With ``flash_attention`` the s^2 terms are replaced by the fp32 softmax
statistics, 4*a*s*b (FlashAttention stores no score matrix).

The most loaded pipeline stage under 1F1B is the first: it holds L/p layers for p in-flight
micro-batches (min(p, m) with m micro-batches), i.e. L layers' worth; Megatron-LM's
theoretical-memory formula (2023-11) adds the embedding input ids (8*s*b) and the embedding
dropout mask (s*b*h) per in-flight micro-batch, and, when the first stage is also the last,
4*s*b*h*(1 + V/h) for the output layer's input and fp32 logits. Interleaved schedules multiply
by 1 + (p-1)/(p*m_v) (Narayanan et al. 2021 Sec. 2.2).

Example::

    layer_activation_bytes(s=2048, b=1, h=12288, a=96, t=8, sequence_parallel=True,
                           recompute="selective")       # 106,954,752 (GPT-3 175B)
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .model import ModelSpec

__all__ = ["layer_activation_bytes", "ActivationEstimate", "stage_activations",
           "interleaved_penalty"]


def layer_activation_bytes(s: int, b: int, h: int, a: int, t: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none", *,
                           q_width: int | None = None, kv_width: int | None = None,
                           ffn: int | None = None, swiglu: bool = False, mlp_copies: float = 1,
                           flash_attention: bool = False) -> float:
    """Activation bytes one transformer layer keeps for backward, on one device.

    Example: GPT-3 175B, s=2048, b=1, t=8: 578,813,952 (TP), 358,612,992 (TP+SP).
    """
    if recompute not in ("none", "selective", "full"):
        raise ConfigError(f"unknown recompute {recompute!r}; expected none, selective or full")
    sbh = float(s * b * h)
    if recompute == "full":
        return 2.0 * sbh / (t if sequence_parallel else 1)
    q = q_width if q_width is not None else h
    kv = kv_width if kv_width is not None else q
    f = ffn if ffn is not None else 4 * h
    replicated = 10.0 * sbh
    mlp = (6.0 if swiglu else 4.0) * s * b * f * mlp_copies
    sharded = 2.0 * s * b * (2 * q + 2 * kv) + mlp
    if recompute == "selective":
        core = 0.0
    elif flash_attention:
        core = 4.0 * a * s * b
    else:
        core = 5.0 * a * s * s * b
    if sequence_parallel:
        return (replicated + sharded + core) / t
    return replicated + (sharded + core) / t


def interleaved_penalty(pp: int, virtual_stages: int) -> float:
    """Activation factor of the interleaved 1F1B schedule: 1 + (p - 1)/(p*m).

    Example: interleaved_penalty(35, 3) = 1.3238 (Korthikanti et al. 2022 Sec. 4.2.3).
    """
    return 1.0 + (pp - 1) / (pp * virtual_stages)


@dataclass(frozen=True)
class ActivationEstimate:
    """Activation bytes of the most loaded pipeline stage, per device, and their parts."""

    total_bytes: float
    layer_bytes: float
    layers_on_stage: float
    in_flight: float
    embedding_bytes: float
    output_bytes: float
    stage: str


def stage_activations(spec: ModelSpec, micro_batch: int = 1, tp: int = 1, pp: int = 1,
                      sequence_parallel: bool = False, recompute: str = "none",
                      num_microbatches: int | None = None, virtual_stages: int | None = None,
                      flash_attention: bool = False) -> ActivationEstimate:
    """Activation bytes per device on the most loaded stage (first or last) under 1F1B.

    Example: GPT-3 175B, TP=8 PP=8 SP + selective, b=1: 10,292,838,400 bytes (9816.02 MiB,
    Megatron-LM's theoretical memory for the same flags).
    """
    s, b, h = spec.seq_len, micro_batch, spec.hidden
    if (spec.heads is None and spec.head_dim is None and recompute == "none"
            and not flash_attention):
        raise ConfigError("the attention-score activations (5*a*s^2*b per layer) need the head "
                          "count: give --heads, or --flash-attention / --recompute selective")
    layer = layer_activation_bytes(
        s, b, h, spec.n_heads, tp, sequence_parallel, recompute, q_width=spec.q_width,
        kv_width=spec.kv_width, ffn=round(spec.mlp_flop_width()), swiglu=spec.swiglu,
        flash_attention=flash_attention)
    in_flight = float(pp if num_microbatches is None else min(pp, num_microbatches))
    penalty = interleaved_penalty(pp, virtual_stages) if virtual_stages and pp > 1 else 1.0
    shard = tp if sequence_parallel else 1
    # Embedding input ids (int64) and embedding dropout mask, per in-flight micro-batch.
    embedding = (8.0 * s * b + 1.0 * s * b * h) / shard * in_flight
    # Output layer: its input and the fp32 logits (vocab-parallel over TP).
    output = 4.0 * s * b * h / shard + 4.0 * s * b * spec.vocab / tp
    layers_per_stage = spec.layers / pp
    first = (layer * layers_per_stage * in_flight + embedding) * penalty
    if pp == 1:
        return ActivationEstimate(first + output, layer, layers_per_stage, in_flight,
                                  embedding, output, "only")
    last = layer * layers_per_stage + output
    if last > first:
        return ActivationEstimate(last, layer, layers_per_stage, 1.0, 0.0, output, "last")
    return ActivationEstimate(first, layer, layers_per_stage, in_flight, embedding, 0.0,
                              "first")
