"""Training memory per device: weights, gradients, optimizer states, activations.

Model states, bytes per parameter (Psi parameters on the device after TP/PP, N_d = DP size).
The convention is chosen by name, since the sources differ:

``zero`` (default) -- Rajbhandari et al. 2020 (ZeRO) Sec. 3.1 / Fig. 1. Mixed precision
    Adam: 2 (fp16/bf16 params) + 2 (grads) + K=12 (fp32 master, momentum, variance) = 16.
    Stage 1 shards the optimizer states over DP, 2 also the grads, 3 also the params:
    (2+2+12/N_d), (2 + 14/N_d), 16/N_d.
``megatron`` -- Megatron-LM ``theoretical_memory_usage.py`` (2023-11): 18 = 2 bf16 params +
    4 fp32 grads + 4 fp32 master + 8 Adam; the distributed optimizer (``--zero 1``) shards
    the 12 over DP: 6 + 12/N_d. It has no ZeRO-2/3.
``deepspeed`` -- DeepSpeed's ``estimate_zero2/zero3_model_states_mem_needs`` (docs
    memory.rst, code @38327e0): ZeRO-2 2*Psi + 18*Psi/n on the GPU (``deepspeed-legacy``:
    the pre-PR #5099 4*Psi + 16*Psi/n), ZeRO-3 4*largest_layer + 18*Psi/n, plus their CPU
    (per node) figures with the 1.5 buffer factor and offload variants. The estimators give
    totals only; the split into weights/grads/optimizer shown is 2/6/12 bytes of the 18 etc.

Precision (``zero`` convention), named so that none can be misread:

* ``bf16-mixed`` (alias ``mixed``, also fp16 mixed precision): 16-bit weights and grads, fp32
  master weights and fp32 Adam moments: 2 + 2 + (4 + 4 + 4) = 16 B/param (ZeRO's K = 12);
* ``bf16-pure`` (alias ``bf16``): everything in bf16, no fp32 master copy (e.g. torchtitan
  with mixed_precision_param=bf16 and no fp32 optimizer): 2 + 2 + 2 per Adam moment;
* ``fp32``: 4 + 4 + 4 per moment.

``grad_dtype`` overrides the gradient bytes (fp32 gradients, as Megatron's main grads or
DeepSpeed's ``fp32`` communication/accumulation, with any ZeRO stage): bf16 2, fp32 4.

Parallelism beyond DP/TP/PP (Megatron-LM's groups, ``theoretical_memory_usage.py`` @d98e8a6):
``ep`` expert parallel and ``etp`` expert tensor parallel (default: = tp) shard the routed
experts over etp x ep; their gradients and optimizer states are sharded over the
expert-data-parallel group EDP = dp x cp x tp / (etp x ep), the other parameters' over
DP x CP. ``cp`` context parallel splits the sequence: activations / cp.

Optimizers: ``adam``/``adamw``
(two moments), ``sgd`` (momentum: one), ``adafactor`` (factored second moment, no momentum:
4*(rows + cols) bytes per matrix, Shazeer & Stern 2018). Offload (ZeRO-Offload/Infinity):
``optimizer`` moves the optimizer states to host memory; ``params`` (ZeRO-3 only) also the
parameters (the device then holds only gathered working layers, not modelled).

Activations: :mod:`stepscope.calc.activations` (Korthikanti et al. 2022).

Example::

    est = estimate(ModelSpec(layers=80, hidden=8192, heads=64, kv_heads=8, ffn_hidden=28672,
                             swiglu=True, vocab=32000, seq_len=4096),
                   dp=8, tp=8, zero=1, recompute="selective", sequence_parallel=True)
    est.total_bytes / 2**30
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .activations import stage_activations
from .model import ModelSpec

__all__ = ["MemoryEstimate", "MEMORY_CONVENTIONS", "PRECISIONS", "GRAD_DTYPES", "estimate",
           "model_states", "check_layout", "deepspeed_estimate", "estimate_memory",
           "canonical_precision"]

MEMORY_CONVENTIONS = ("zero", "megatron", "deepspeed", "deepspeed-legacy")
_OPTIMIZERS = ("adam", "adamw", "sgd", "adafactor")
PRECISIONS = ("bf16-mixed", "bf16-pure", "fp32")
PRECISION_ALIASES = {"mixed": "bf16-mixed", "bf16": "bf16-pure", "fp16-mixed": "bf16-mixed"}
GRAD_DTYPES = ("bf16", "fp32")
_PRECISIONS = (*PRECISIONS, *PRECISION_ALIASES)
# (weight bytes, grad bytes, bytes per optimizer state, fp32 master copy?) per precision.
_PRECISION_BYTES = {"bf16-mixed": (2, 2, 4, True), "bf16-pure": (2, 2, 2, False),
                    "fp32": (4, 4, 4, False)}


def canonical_precision(name: str) -> str:
    """bf16-mixed, bf16-pure or fp32 (old names mixed / bf16 accepted)."""
    _check_choice("precision", name, _PRECISIONS)
    return PRECISION_ALIASES.get(name, name)
_STATES = {"adam": 2, "adamw": 2, "sgd": 1, "adafactor": 0}


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device (the most loaded one). ``host_bytes``: offloaded states, host side."""

    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    model_states_bytes: float
    activations_bytes: float
    total_bytes: float
    host_bytes: float = 0.0
    params_per_device: float = 0.0
    convention: str = "zero"
    breakdown: dict[str, float] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    expert_params_per_device: float = 0.0

    def to_dict(self) -> dict[str, object]:
        """JSON-ready dict (the CLI's ``memory --json`` keys first)."""
        return {
            "weights_bytes": self.weights_bytes, "grads_bytes": self.grads_bytes,
            "optimizer_bytes": self.optimizer_bytes,
            "model_states_bytes": self.model_states_bytes,
            "activations_bytes": self.activations_bytes, "total_bytes": self.total_bytes,
            "host_bytes": self.host_bytes, "params_per_device": self.params_per_device,
            "convention": self.convention, "breakdown": dict(self.breakdown),
            "notes": list(self.notes), "expert_params_per_device": self.expert_params_per_device,
        }


def check_layout(spec: ModelSpec | None, dp: int = 1, tp: int = 1, pp: int = 1,
                 zero: int = 0, ep: int = 1, etp: int | None = None, cp: int = 1) -> None:
    """Raise ConfigError for a layout that cannot exist (TP vs heads, PP vs layers, EP)."""
    for key, value in (("dp", dp), ("tp", tp), ("pp", pp), ("ep", ep), ("cp", cp),
                       ("etp", etp or 1)):
        if value < 1:
            raise ConfigError(f"--{key} must be >= 1, got {value}")
    if zero not in (0, 1, 2, 3):
        raise ConfigError(f"--zero must be 0, 1, 2 or 3, got {zero}")
    if (dp * cp * tp) % ((etp or tp) * ep):
        raise ConfigError(f"expert parallel {ep} x expert tensor parallel {etp or tp} must "
                          f"divide DP x CP x TP = {dp * cp * tp} (the experts' ranks are the "
                          "non-pipeline ranks)")
    if spec is None:
        return
    if spec.heads is not None and spec.n_heads % tp:
        raise ConfigError(f"tensor parallel size {tp} must divide the {spec.n_heads} attention "
                          "heads (each TP rank holds whole heads); pick a divisor of the heads")
    if spec.kv_heads is not None and spec.n_kv_heads % tp and tp % spec.n_kv_heads:
        raise ConfigError(f"tensor parallel size {tp} and the {spec.n_kv_heads} KV heads must "
                          "divide one another")
    if pp > spec.layers:
        raise ConfigError(f"pipeline parallel size {pp} exceeds the {spec.layers} layers; "
                          "each stage needs at least one layer")
    if ep > 1 and (not spec.moe_experts or spec.moe_experts % ep):
        raise ConfigError(f"expert parallel size {ep} must divide the {spec.moe_experts} routed "
                          "experts (a dense model has none: use --ep 1)")
    if spec.seq_len % cp:
        raise ConfigError(f"context parallel size {cp} must divide the sequence length "
                          f"{spec.seq_len}")


def _params_per_device(spec: ModelSpec, tp: int, pp: int, ep: int = 1,
                       etp: int | None = None) -> tuple[float, float, str]:
    """(non-expert, routed-expert) parameters on the most loaded device before ZeRO.

    Megatron's most-loaded shard: (transformer layers incl. final norm / pp + token
    embedding [+ untied head if pp == 1] + position table [+ MTP on the last stage]) / tp;
    routed experts (layers / pp) / (etp x ep). Megatron-LM theoretical_memory_usage.py (the
    2023-11 form divides the norms by tp too, as here; since 2025 they stay replicated: a
    difference of the norms only).
    """
    if spec.params is not None or not spec.has_shape:
        return spec.num_params() / (tp * pp), 0.0, "params split evenly over TP x PP (no shape)"
    emb = spec.input_embedding_params(tp)
    extra = emb if (not spec.tied_embeddings and pp == 1) else 0
    mtp = sum(m.numel for m in spec.matrices(tp) if m.name.startswith("mtp_"))
    mtp_expert = sum(m.numel for m in spec.matrices(tp) if m.name.startswith("mtp_") and m.expert)
    expert = spec.expert_params() - mtp_expert
    dense_layers = spec.layer_params(tp) - mtp - expert
    stage = (dense_layers / pp + (mtp - mtp_expert) + emb + extra
             + spec.position_embedding_params())
    experts_here = (expert / pp + mtp_expert) / ((etp or tp) * ep)
    where = "most loaded stage: layers/pp + embedding, / tp (Megatron-LM)"
    if spec.moe_experts:
        where += f"; routed experts / (etp {etp or tp} x ep {ep})"
    return stage / tp, experts_here, where


def model_states(params: float, dp: int = 1, zero: int = 0, optimizer: str = "adam",
                 precision: str = "mixed", convention: str = "zero",
                 offload: str | None = None,
                 adafactor_state_params: float | None = None,
                 grad_dtype: str | None = None) -> tuple[float, float, float, float, list[str]]:
    """(weights, grads, optimizer, host) bytes per device for ``params`` on it, and notes.

    Example: model_states(7.5e9, dp=64, zero=1) -> 31.406e9 bytes in all (ZeRO Fig. 1).
    """
    _check_choice("optimizer", optimizer, _OPTIMIZERS)
    precision = canonical_precision(precision)
    _check_choice("convention", convention, MEMORY_CONVENTIONS)
    if grad_dtype is not None:
        _check_choice("grad dtype", grad_dtype, GRAD_DTYPES)
    if offload not in (None, "none", "optimizer", "params"):
        raise ConfigError(f"--offload must be optimizer or params, got {offload!r}")
    if offload == "params" and zero != 3:
        raise ConfigError("--offload params needs --zero 3 (only ZeRO-3 partitions parameters)")
    notes: list[str] = []
    if convention == "megatron":
        w, g, opt = _megatron_states(params, dp, zero, optimizer, precision, grad_dtype, notes)
    else:
        w, g, opt = _zero_states(params, dp, zero, optimizer, precision, grad_dtype,
                                 adafactor_state_params, notes)
    host = 0.0
    if offload in ("optimizer", "params"):
        host, opt = opt, 0.0
        notes.append("optimizer states offloaded to host memory")
    if offload == "params":
        host, w = host + w, 0.0
        notes.append("parameters offloaded to host; gathered working layers not modelled")
    return w, g, opt, host, notes


def _megatron_states(params: float, dp: int, zero: int, optimizer: str, precision: str,
                     grad_dtype: str | None, notes: list[str]) -> tuple[float, float, float]:
    if precision != "bf16-mixed" or optimizer not in ("adam", "adamw") or grad_dtype == "bf16":
        raise ConfigError("the megatron convention is mixed-precision Adam (18 B/param); "
                          "use --convention zero for other precisions or optimizers")
    if zero > 1:
        raise ConfigError("the megatron convention has ZeRO-1 only (its distributed "
                          "optimizer); use --convention zero for stages 2 and 3")
    notes.append("Megatron-LM: 18 B/param" if zero == 0 else "Megatron-LM distributed "
                 "optimizer: 6 + 12/DP B/param")
    # bf16 params, fp32 main grads, fp32 master + Adam sharded by the distributed optimizer
    return 2.0 * params, 4.0 * params, 12.0 * params / (dp if zero == 1 else 1)


def _zero_states(params: float, dp: int, zero: int, optimizer: str, precision: str,
                 grad_dtype: str | None, adafactor_state_params: float | None,
                 notes: list[str]) -> tuple[float, float, float]:
    w_b, g_b, s_b, master = _PRECISION_BYTES[precision]
    per_state = s_b * _STATES[optimizer]
    if grad_dtype is not None:
        g_b = 4 if grad_dtype == "fp32" else 2
    w, g = w_b * params, g_b * params
    opt = (per_state + (4 if master else 0)) * params
    if optimizer == "adafactor":
        opt += 4.0 * (adafactor_state_params if adafactor_state_params is not None else 0.0)
        if adafactor_state_params is None:
            notes.append("adafactor factored statistics not counted (no shape given)")
    notes.append(f"precision {precision}: {w_b} B weights + {g_b} B grads"
                 + (" + 4 B fp32 master" if master else "")
                 + f" + {per_state} B {optimizer} state per parameter")
    return (w / (dp if zero >= 3 else 1), g / (dp if zero >= 2 else 1),
            opt / (dp if zero >= 1 else 1))


def estimate(spec: ModelSpec | None, *, params: float | None = None, dp: int = 1, tp: int = 1,
             pp: int = 1, zero: int = 0, optimizer: str = "adam", precision: str = "mixed",
             micro_batch: int = 1, recompute: str = "none", sequence_parallel: bool = False,
             offload: str | None = None, convention: str = "zero",
             num_microbatches: int | None = None, virtual_stages: int | None = None,
             flash_attention: bool = False, gpus_per_node: int | None = None,
             largest_layer_params: float | None = None, zero_init: bool = True,
             ep: int = 1, etp: int | None = None, cp: int = 1, grad_dtype: str | None = None
             ) -> MemoryEstimate:
    """Memory per device for a layout; ``spec`` None (``params`` only) gives model states.

    ``dp`` is the data-parallel size (world = dp x cp x tp x pp); the optimizer shards over
    DP x CP, the routed experts' over EDP = dp x cp x tp / (etp x ep).

    Example: ``estimate(None, params=7e9, dp=8, zero=3).total_bytes`` = 14.0e9 (16 Psi / 8).
    """
    check_layout(spec, dp, tp, pp, zero, ep, etp, cp)
    if spec is None and params is None:
        raise ConfigError("give a model: --params N or the shape flags")
    if convention.startswith("deepspeed"):
        if tp * pp * ep * cp > 1:
            raise ConfigError("DeepSpeed's estimators model pure data parallel (TP = PP = EP = "
                              "CP = 1); use --convention zero with --tp/--pp/--ep/--cp")
        return deepspeed_estimate(spec, params=params, dp=dp, zero=zero, offload=offload,
                                  legacy=convention == "deepspeed-legacy",
                                  gpus_per_node=gpus_per_node,
                                  largest_layer_params=largest_layer_params,
                                  zero_init=zero_init, micro_batch=micro_batch,
                                  recompute=recompute, flash_attention=flash_attention)
    if spec is None:
        assert params is not None
        dense, expert, where = params / (tp * pp), 0.0, "params split evenly over TP x PP"
    else:
        dense, expert, where = _params_per_device(spec, tp, pp, ep, etp)
    edp = dp * cp * tp // ((etp or tp) * ep)
    adafactor = (_adafactor_stats(spec, tp * pp) if optimizer == "adafactor" and spec
                 else None)
    w, g, o, host, notes = model_states(dense, dp * cp, zero, optimizer, precision, convention,
                                        offload, adafactor, grad_dtype)
    if expert:
        ew, eg, eo, ehost, _ = model_states(expert, edp, zero, optimizer, precision,
                                            convention, offload, 0.0, grad_dtype)
        w, g, o, host = w + ew, g + eg, o + eo, host + ehost
        notes.append(f"routed experts: {expert:,.0f} params here, states sharded over the "
                     f"expert-data-parallel group of {edp}")
    notes.insert(0, where)
    if zero == 3:
        notes.append("ZeRO-3 also gathers one layer's full parameters at a time (not counted "
                     "here; DeepSpeed's estimator adds 4 x the largest layer)")
    act, breakdown = _activations(spec, micro_batch, tp, pp, cp, sequence_parallel, recompute,
                                  num_microbatches, virtual_stages, flash_attention, notes)
    return _result(w, g, o, act, host, dense + expert, convention, breakdown, notes, expert)


def _activations(spec: ModelSpec | None, micro_batch: int, tp: int, pp: int, cp: int,
                 sequence_parallel: bool, recompute: str, num_microbatches: int | None,
                 virtual_stages: int | None, flash: bool,
                 notes: list[str]) -> tuple[float, dict[str, float]]:
    if spec is None:
        notes.append("activations not estimated: give --layers --hidden --seq-len (and --vocab)")
        return 0.0, {}
    a = stage_activations(spec, micro_batch, tp, pp, sequence_parallel, recompute,
                          num_microbatches, virtual_stages, flash)
    breakdown = {"activation_per_layer_bytes": a.layer_bytes / cp,
                 "layers_on_stage": a.layers_on_stage, "in_flight_microbatches": a.in_flight,
                 "embedding_activation_bytes": a.embedding_bytes / cp,
                 "output_activation_bytes": a.output_bytes / cp}
    notes.append(f"activations: {a.stage} pipeline stage, Korthikanti et al. 2022; attention "
                 + ("scores not stored (flash/SDPA kernels: softmax statistics only)" if flash
                    else "scores stored (5*a*s^2*b per layer: eager attention)")
                 + (f"; sequence split over context parallel {cp}" if cp > 1 else ""))
    return a.total_bytes / cp, breakdown


def estimate_memory(num_params: float, dp: int = 1, zero_stage: int = 0,
                    **kwargs: Any) -> MemoryEstimate:
    """Model states per device from a parameter count alone (keyword form of :func:`estimate`).

    Example: ``estimate_memory(num_params=7e9, dp=8, zero_stage=3).model_states_bytes``
    = 14.0e9 (16 Psi / 8).
    """
    return estimate(None, params=num_params, dp=dp, zero=zero_stage, **kwargs)


def _result(w: float, g: float, o: float, act: float, host: float, per_dev: float,
            convention: str, breakdown: dict[str, float], notes: list[str],
            expert: float = 0.0) -> MemoryEstimate:
    states = w + g + o
    return MemoryEstimate(weights_bytes=w, grads_bytes=g, optimizer_bytes=o,
                          model_states_bytes=states, activations_bytes=act,
                          total_bytes=states + act, host_bytes=host, params_per_device=per_dev,
                          convention=convention, breakdown=breakdown, notes=tuple(notes),
                          expert_params_per_device=expert)


def deepspeed_estimate(spec: ModelSpec | None, *, params: float | None = None, dp: int = 1,
                       zero: int = 2, offload: str | None = None, legacy: bool = False,
                       gpus_per_node: int | None = None,
                       largest_layer_params: float | None = None, zero_init: bool = True,
                       micro_batch: int = 1, recompute: str = "none",
                       flash_attention: bool = False) -> MemoryEstimate:
    """DeepSpeed's ZeRO-2/3 model-state estimators (GPU and per-node CPU), plus activations.

    n = dp GPUs in dp / gpus_per_node nodes. Example (t5-3b, 8 GPUs, ZeRO-2, current code):
    ``deepspeed_estimate(None, params=2851e6, dp=8).model_states_bytes / 2**30`` = 11.28.
    """
    if zero not in (2, 3):
        raise ConfigError("DeepSpeed's estimators cover ZeRO stages 2 and 3; use "
                          "--convention zero for stages 0 and 1")
    psi = float(params if params is not None else spec.num_params() if spec else 0.0)
    per_node = gpus_per_node or min(dp, 8)
    nodes = max(1, dp // per_node)
    buf = 1.5  # DeepSpeed's additional_buffer_factor default
    if zero == 2:
        w, g, o, host = _ds_zero2(psi, dp, per_node, offload, legacy, buf)
    else:
        if largest_layer_params is None:
            if spec is None:
                raise ConfigError("ZeRO-3 estimate needs the largest layer's parameters; give "
                                  "the shape flags or --largest-layer-params")
            largest_layer_params = float(max(m.rows * m.cols for m in spec.matrices()))
        w, g, o, host = _ds_zero3(psi, dp, per_node, nodes, offload, zero_init,
                                  largest_layer_params, buf)
    notes = [f"DeepSpeed estimate_zero{zero}_model_states_mem_needs"
             + (" (pre-PR #5099)" if legacy else "") + "; host_bytes is per node"]
    act = 0.0
    if spec is not None:
        act = stage_activations(spec, micro_batch, 1, 1, False, recompute,
                                flash_attention=flash_attention).total_bytes
    return _result(w, g, o, act, host, psi, "deepspeed-legacy" if legacy else "deepspeed",
                   {}, notes)


def _ds_zero2(psi: float, n: int, per_node: int, offload: str | None, legacy: bool,
              buf: float) -> tuple[float, float, float, float]:
    if offload in ("optimizer", "params"):
        return 2.0 * psi, 0.0, 0.0, psi * max(4 * n, 16) * buf
    host = psi * 4 * per_node * buf
    if legacy:  # 4*Psi + 16*Psi/n
        return 2.0 * psi, 2.0 * psi + 4.0 * psi / n, 12.0 * psi / n, host
    return 2.0 * psi, 6.0 * psi / n, 12.0 * psi / n, host  # 2*Psi + 18*Psi/n


def _ds_zero3(psi: float, n: int, per_node: int, nodes: int, offload: str | None,
              zero_init: bool, largest: float, buf: float) -> tuple[float, float, float, float]:
    layer = 4.0 * largest  # the gathered largest layer: fp16 params + grads
    node_share = 1.0 / nodes
    if offload == "params":
        host = psi * (18 * node_share if zero_init else max(4 * per_node, 18 * node_share))
        return layer, 0.0, 0.0, host * buf
    if offload == "optimizer":
        host = psi * (16 * node_share if zero_init else max(4 * per_node, 16 * node_share))
        return layer + 2.0 * psi / n, 0.0, 0.0, host * buf
    host = (largest if zero_init else psi) * 4 * per_node * buf
    return layer + 2.0 * psi / n, 4.0 * psi / n, 12.0 * psi / n, host


def _adafactor_stats(spec: ModelSpec, shards: int) -> float:
    """Adafactor's factored second-moment entries: rows + cols per matrix, n per vector."""
    total = 0.0
    for m in spec.matrices():
        total += (m.rows + m.cols if m.cols > 1 else m.rows) * m.count
    return total / shards


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"unknown {name} {value!r}; expected one of {', '.join(choices)}")
