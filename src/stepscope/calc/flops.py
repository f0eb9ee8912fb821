"""Training FLOPs per token under named conventions, and MFU / HFU.

MFU = achieved model FLOP/s / (devices x dense peak FLOP/s per device). Tools disagree on the
numerator; each convention below is one published choice, selected by name, and the result
always says which was used (:attr:`FlopsEstimate.convention`, :attr:`FlopsEstimate.formula`).

Notation: N parameters used per token, L layers, h hidden, H*Q = attention width (query heads x
head dim), g*Q = KV width, f FFN width, V vocabulary, T sequence length. A matmul with a
(m x k) weight costs 2*m*k FLOPs per token forward and twice that backward (grad wrt input and
wrt weight), hence 6 per weight per token for forward + backward.

``palm`` (default) -- PaLM, Chowdhery et al. 2022, App. B: 6N + 12*L*H*Q*T.
    N counts every parameter except learned position tables (nanoGPT's ``non_embedding``
    count); with untied embeddings the input lookup is counted too, as PaLM/nanoGPT do.
    12*L*H*Q*T: per layer QK^T and AV are 2*T*H*Q FLOPs each per token forward, x3 for
    forward+backward; no causal halving.
``torchtitan`` -- torchtitan ``get_nparams_and_flops``: 6*(N - input embedding) + 12*L*H*Q*T.
    The token-embedding lookup does no matmul work. (For tied embeddings the shared matrix is
    also the output projection, which is real work, so it stays counted here; torchtitan's code
    would subtract it, its models being untied.)
``6n`` -- Kaplan et al. 2020 Eq. 2.1 / the field report's "~6N": 6N, no attention term.
``megatron-2022`` -- Korthikanti et al. 2022 Eq. 7, 72*B*s*L*h^2*(1 + s/(6h) + V/(12hL)) per
    iteration, generalised the way Megatron-LM's ``num_floating_point_operations`` did before
    2025-03 (GQA, SwiGLU, f, MoE top-k): per token 6*[2h*H*Q + 2h*g*Q + m*h*f*k] per layer
    + 12*T*H*Q per layer + 6*h*V, m = 3 for SwiGLU else 2. Norms, biases and the router are
    not counted. Reduces to Eq. 7 for MHA with f = 4h (tested).
``megatron`` -- Megatron-LM since 2025-03: as ``megatron-2022`` with the core-attention term
    halved for causal masks (6*T*H*Q per layer).

Recompute (hardware FLOPs, HFU): D = the dense (matmul) part, A = the attention core part.
``full`` adds one forward: PaLM/llm-foundry add D/3 + A/3 (HFU = 4/3 MFU exactly; PaLM 540B
re-materialised 75% of the dense forward: ``recompute_fraction=0.75``); Megatron (Narayanan
et al. 2021 Eq. 3) does not recompute the logits: (D - 6hV)/3 + A/3. ``selective`` recomputes
the attention core: PaLM App. B adds its forward, A/3 (= 4*L*H*Q*T); Korthikanti et al. 2022
Sec. 5 count it at A (their "2.7% overhead" for GPT-3), which the Megatron conventions follow.

Example::

    spec = ModelSpec(layers=12, hidden=768, heads=12, vocab=50257, seq_len=1024,
                     tied_embeddings=True, position_embeddings=1024)
    est = flops_per_token(spec)                      # palm: 854,553,600 FLOPs/token
    mfu(tokens_per_s=100 * 1024 / 0.755, flops_per_token=est.flops_per_token,
        peak_flops_per_device=312e12, devices=1)     # 0.3715
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .model import ModelSpec

__all__ = [
    "ModelSpec",
    "FlopsEstimate",
    "CONVENTIONS",
    "RECOMPUTE",
    "flops_per_token",
    "six_n_flops",
    "check_utilization",
    "forward_flops_breakdown",
    "mfu",
    "hfu",
    "tokens_per_s_from_step",
    "profiler_flops_per_s",
]

CONVENTIONS = ("palm", "megatron", "megatron-2022", "torchtitan", "6n")
RECOMPUTE = ("none", "selective", "full")

_SOURCES = {
    "palm": "PaLM (Chowdhery et al. 2022) App. B: 6N + 12*L*H*Q*T",
    "torchtitan": "torchtitan models/utils.py get_nparams_and_flops: 6*(N - emb) + 12*L*H*Q*T",
    "6n": "Kaplan et al. 2020 Eq. 2.1: C = 6N (no attention term)",
    "megatron-2022": "Korthikanti et al. 2022 Eq. 7 / Megatron-LM num_floating_point_operations "
                     "(before 2025-03): full attention",
    "megatron": "Megatron-LM num_floating_point_operations (since 2025-03): causal attention "
                "halved",
}


@dataclass(frozen=True)
class FlopsEstimate:
    """Training FLOPs per token (forward + backward) and the hardware FLOPs with recompute.

    ``dense_flops_per_token`` + ``attention_flops_per_token`` = ``flops_per_token``;
    ``recompute_flops_per_token`` is what recompute adds on top (hardware - model).
    """

    flops_per_token: float
    hardware_flops_per_token: float
    convention: str
    recompute: str
    causal: bool
    dense_flops_per_token: float
    attention_flops_per_token: float
    recompute_flops_per_token: float
    formula: str
    source: str


def flops_per_token(spec: ModelSpec, convention: str = "palm", recompute: str = "none",
                    causal: bool | None = None, recompute_fraction: float = 1.0,
                    tp: int = 1) -> FlopsEstimate:
    """FLOPs per trained token for ``spec`` under ``convention`` (see the module docstring).

    ``causal`` halves the attention-core term; None takes the convention's own choice (only
    ``megatron`` halves). ``recompute_fraction`` is the share of the dense forward re-run by
    ``full`` recompute (PaLM 540B: 0.75). ``tp`` only pads the vocabulary (``vocab_divisor``).

    Example::

        flops_per_token(llama3_8b, "torchtitan").flops_per_token   # 57,914,449,920
    """
    if convention not in CONVENTIONS:
        raise ConfigError(f"unknown FLOPs convention {convention!r}; expected one of "
                          f"{', '.join(CONVENTIONS)}")
    if recompute not in RECOMPUTE:
        raise ConfigError(f"unknown recompute {recompute!r}; expected one of "
                          f"{', '.join(RECOMPUTE)}")
    if not 0.0 <= recompute_fraction <= 1.0:
        raise ConfigError(f"recompute_fraction must be in [0, 1], got {recompute_fraction}")
    is_causal = (convention == "megatron") if causal is None else causal
    megatron = convention.startswith("megatron")
    dense, logits, formula = (_megatron_dense(spec, tp) if megatron
                              else _param_dense(spec, convention, tp))
    # Attention core QK^T and AV: 2*T*H*Q FLOPs each per token per layer forward, x3 with
    # backward = 12*L*H*Q*T (PaLM App. B; Korthikanti's 72Bslh^2 * s/(6h) is the same).
    # MLA: H*Q -> heads x (qk dims + v dim) / 2, as Megatron-LM counts it; MTP layers attend.
    attn_layers = spec.layers + spec.mtp_layers
    attention = (0.0 if convention == "6n"
                 else 12.0 * attn_layers * spec.attn_core_width * spec.seq_len)
    if is_causal:
        attention /= 2.0
        formula += " + 6*L*H*Q*T (causal: half of 12*L*H*Q*T)"
    elif attention:
        formula += " + 12*L*H*Q*T"
    extra = _recompute_extra(recompute, megatron, dense, logits, attention, recompute_fraction)
    model = dense + attention
    return FlopsEstimate(
        flops_per_token=model, hardware_flops_per_token=model + extra, convention=convention,
        recompute=recompute, causal=is_causal, dense_flops_per_token=dense,
        attention_flops_per_token=attention, recompute_flops_per_token=extra,
        formula=formula, source=_SOURCES[convention])


def six_n_flops(params: float, recompute: str = "none") -> FlopsEstimate:
    """The ``6n`` convention from a parameter count alone (no shape needed): 6N per token.

    Full recompute adds one forward (2N); selective adds nothing (no attention term in 6N).
    """
    _check_positive(params=params)
    if recompute not in RECOMPUTE:
        raise ConfigError(f"unknown recompute {recompute!r}; expected one of "
                          f"{', '.join(RECOMPUTE)}")
    dense = 6.0 * params
    extra = dense / 3.0 if recompute == "full" else 0.0
    return FlopsEstimate(
        flops_per_token=dense, hardware_flops_per_token=dense + extra, convention="6n",
        recompute=recompute, causal=False, dense_flops_per_token=dense,
        attention_flops_per_token=0.0, recompute_flops_per_token=extra, formula="6*N",
        source=_SOURCES["6n"])


def check_utilization(name: str, value: float) -> None:
    """Raise ConfigError for an MFU/HFU above 100%, naming the likely causes."""
    if value > 1.0:
        raise ConfigError(
            f"{name} {value:.1%} is impossible (above 100%): check the device count (every "
            "device of the run, all nodes), the peak (dense per device: a datasheet figure "
            "'with sparsity' is 2x the dense one) and the throughput's units (tokens/s over "
            "all devices and the whole optimizer step, not per device, not samples/s)")


def _param_dense(spec: ModelSpec, convention: str, tp: int) -> tuple[float, float, str]:
    """6N for the parameter-count conventions; returns (dense, logits part, formula)."""
    n = spec.num_active_params(tp)
    if spec.params is None:
        n -= spec.position_embedding_params()  # a table lookup, no matmul (nanoGPT)
    formula = "6*N"
    if convention == "torchtitan":
        if spec.vocab <= 0:
            raise ConfigError("the torchtitan convention subtracts the input embedding V*h; "
                              "give --vocab V")
        if not spec.tied_embeddings:
            n -= spec.input_embedding_params(tp)
        formula = "6*(N - V*h)"
    logits = 6.0 * spec.hidden * spec.padded_vocab(tp)
    return 6.0 * n, logits, formula


def _attention_linear_params(spec: ModelSpec) -> float:
    """One layer's attention projection weights as Megatron counts them (MLA: with norms)."""
    return float(sum(m.numel for m in spec.attention_matrices()))


def _megatron_dense(spec: ModelSpec, tp: int = 1) -> tuple[float, float, str]:
    """Megatron's matmul count per token (forward + backward), without the attention core.

    Megatron-LM ``num_floating_point_operations``: per layer 6 x (attention projections +
    h*m*(f dense | f_e*k + shared, MoE)); MTP adds its layers, 6*(3h + 2h^2) and one more
    logit layer each; logits 6*h*V (V padded).
    """
    if spec.vocab <= 0:
        raise ConfigError("the megatron conventions count the logit layer 6*h*V; give --vocab V")
    h, m = spec.hidden, spec.mlp_mats  # SwiGLU: gate, up, down (Megatron's 3/2 multiplier)
    moe_width = spec.expert_ffn * spec.moe_top_k + spec.shared_ffn
    attn = _attention_linear_params(spec)
    mtp = spec.mtp_layers
    mtp_width = moe_width if spec.moe_layers else spec.ffn
    dense = 6.0 * ((spec.layers + mtp) * attn
                   + h * m * (spec.dense_layers * spec.ffn + spec.moe_layers * moe_width
                              + mtp * mtp_width)
                   + mtp * (3 * h + 2 * h * h))
    logits = 6.0 * h * spec.padded_vocab(tp) * (1 + mtp)
    return dense + logits, logits, "6*L*(attention projections + m*h*f*k) + 6*h*V"


def _recompute_extra(recompute: str, megatron: bool, dense: float, logits: float,
                     attention: float, fraction: float) -> float:
    """FLOPs recompute adds per token (see the module docstring for the sources)."""
    if recompute == "none":
        return 0.0
    if recompute == "selective":
        # Korthikanti Sec. 5 (Megatron): the recomputed core attention counted at A;
        # PaLM App. B: its forward only, A/3 = 4*L*H*Q*T.
        return attention if megatron else attention / 3.0
    # full: one more forward of what is checkpointed. Megatron (Narayanan 2021 Eq. 3) keeps
    # the logit layer out of the recompute; PaLM / llm-foundry recompute everything.
    recomputed_dense = (dense - logits) if megatron else dense
    return fraction * recomputed_dense / 3.0 + attention / 3.0


def forward_flops_breakdown(spec: ModelSpec, batch: int = 1) -> dict[str, float]:
    """Explicit forward matmul FLOPs per sequence batch, nanoGPT-notebook style (no causal).

    Keys: attention_qkv, attention_scores, attention_reduce, attention_proj, mlp (per layer;
    the mean over layers for mixed dense/MoE models),
    transformer (all layers), lm_head, forward, forward_backward (= 3 x forward). This is what
    torch's FlopCounterMode measures (matmuls and SDPA; norms, softmax and lookups are 0).

    Example::

        forward_flops_breakdown(gpt2_124m)["forward"]   # 291,648,307,200
    """
    t, h = spec.seq_len * batch, spec.hidden
    per_layer = {
        "attention_qkv": 2.0 * t * (_attention_linear_params(spec) - spec.v_width * h),
        "attention_scores": 2.0 * t * spec.seq_len * spec.q_width,
        "attention_reduce": 2.0 * t * spec.seq_len * spec.v_width,
        "attention_proj": 2.0 * t * spec.v_width * h,
        "mlp": 2.0 * t * h * spec.mlp_flop_width() * spec.mlp_mats,
    }
    out = dict(per_layer)
    out["transformer"] = spec.layers * sum(per_layer.values())
    out["lm_head"] = 2.0 * t * h * spec.padded_vocab()
    out["forward"] = out["transformer"] + out["lm_head"]
    out["forward_backward"] = 3.0 * out["forward"]
    return out


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops_per_device: float,
        devices: int) -> float:
    """Model FLOPs utilization: tokens/s x FLOPs/token / (devices x peak), a fraction.

    ``tokens_per_s`` must count every token of an optimizer step (all micro-batches of
    gradient accumulation, all data-parallel ranks) over the step's wall time; see
    :func:`tokens_per_s_from_step`.

    Example::

        mfu(238_300, 6 * 540e9, 275e12, 6144)   # 0.45697 (PaLM 540B, 6N only)
    """
    _check_positive(tokens_per_s=tokens_per_s, flops_per_token=flops_per_token,
                    peak_flops_per_device=peak_flops_per_device, devices=devices)
    return tokens_per_s * flops_per_token / (devices * peak_flops_per_device)


def hfu(tokens_per_s: float, hardware_flops_per_token: float, peak_flops_per_device: float,
        devices: int) -> float:
    """Hardware FLOPs utilization: as :func:`mfu` with recompute FLOPs included."""
    return mfu(tokens_per_s, hardware_flops_per_token, peak_flops_per_device, devices)


def tokens_per_s_from_step(step_time_s: float, seq_len: int, global_batch: int | None = None,
                           *, micro_batch: int | None = None, grad_accum: int = 1,
                           dp: int = 1) -> float:
    """Tokens per second of one optimizer step.

    ``global_batch`` is sequences per optimizer step; if absent it is micro_batch x
    grad_accum x dp. Gradient accumulation does not change MFU: k micro-batches take ~k times
    as long and carry k times the tokens.

    Example::

        tokens_per_s_from_step(0.755, 1024, micro_batch=20, grad_accum=5)   # 135,627
    """
    if global_batch is None:
        if micro_batch is None:
            raise ConfigError("give the global batch (sequences per optimizer step) or the "
                              "micro-batch with grad_accum and dp")
        global_batch = micro_batch * grad_accum * dp
    _check_positive(step_time_s=step_time_s, seq_len=seq_len, global_batch=global_batch)
    return global_batch * seq_len / step_time_s


def profiler_flops_per_s(fwd_flops: float, fwd_latency_s: float, bwd_latency_s: float,
                         recompute_fwd_factor: float = 0.0) -> dict[str, float]:
    """Achieved FLOP/s from a measured forward, DeepSpeed flops-profiler style.

    Backward = 2x forward FLOPs (+ r forwards recomputed), so fwd+bwd = (3 + r) x forward
    (DeepSpeed docs/_tutorials/flops-profiler.md, ``recompute_fwd_factor``).

    Example: profiler_flops_per_s(6279.86e9, 0.07667, 0.10802)["fwd_bwd_flops_per_s"]
    = 102.0e12 (the BERT-large example of that page).
    """
    _check_positive(fwd_flops=fwd_flops, fwd_latency_s=fwd_latency_s,
                    bwd_latency_s=bwd_latency_s)
    r = recompute_fwd_factor
    return {"fwd_flops_per_s": fwd_flops / fwd_latency_s,
            "bwd_flops_per_s": (2.0 + r) * fwd_flops / bwd_latency_s,
            "fwd_bwd_flops_per_s": (3.0 + r) * fwd_flops / (fwd_latency_s + bwd_latency_s)}


def _check_positive(**values: float) -> None:
    for key, value in values.items():
        if not value > 0:
            raise ConfigError(f"{key} must be positive, got {value}")
