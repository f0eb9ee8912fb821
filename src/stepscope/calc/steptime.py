"""Estimated step time of a parallel layout: compute at a stated efficiency, communication
from message sizes and per-link bandwidth, and the pipeline bubble.

Model (each term per device, per optimizer step; b micro-batch, s/cp the local sequence,
h hidden, m micro-batches per step, p pipeline stages; ring collectives: an all-reduce of M
bytes over n ranks moves 2(n-1)/n x M per rank, an all-gather, reduce-scatter or all-to-all
(n-1)/n x M):

* compute = global batch x seq x hardware FLOPs per token / (devices x peak x efficiency):
  ``efficiency`` is the share of the dense peak the matmuls reach (stated, default 0.5);
* tensor parallel (Megatron, Narayanan et al. 2021 Sec. 3.2; with sequence parallelism the
  all-reduces become reduce-scatter + all-gather of the same volume, Korthikanti et al. 2022
  Sec. 4.2.2): 4 all-reduces of s*b*h*2 bytes per layer per micro-batch (2 forward, 2
  backward; full recompute adds the 2 forward ones again), on the critical path (exposed);
* expert parallel: 4 all-to-alls (dispatch and combine, forward and backward) of
  s*b*h*2*top_k bytes per MoE layer per micro-batch, exposed;
* context parallel (ring attention): each rank passes its K/V chunk (s/cp)*b*2*kv*2 bytes
  cp-1 times forward and twice that backward, overlappable with the attention-core compute
  (exposed: what exceeds it);
* pipeline: the activation s*b*h*2 bytes sent forward and its gradient back per micro-batch
  (counted exposed), and the 1F1B bubble: stage time x (m + p - 1)/m, i.e. the bubble is
  (p-1)/(m+p-1) of the step (Narayanan et al. 2021 Sec. 2.2);
* data parallel: the gradients' all-reduce (or reduce-scatter + all-gather, ZeRO-1/2: same
  volume) once per step over DP x CP (routed experts over the expert-data-parallel group),
  overlappable with the last micro-batch's backward; ZeRO-3 also all-gathers the
  parameters forward and backward every micro-batch (3x the all-reduce's half), overlappable
  with that micro-batch's compute.

Link bandwidths: a group stays inside a node when its ranks span at most devices_per_node
(Megatron's rank order: TP innermost, then CP, EP within DP, DP, PP outermost); defaults per
device in :data:`LINKS` with their sources, overridable. Peak link figures: the estimate is
a lower bound on the time (NCCL reaches ~80-90% of them on large messages).

Example::

    est = step_time(spec, layout, peak_flops=989.5e12, links=LINKS["H100 SXM"])
    est.step_s, est.mfu
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .model import ModelSpec

__all__ = ["Links", "LINKS", "links_for", "StepEstimate", "LayoutShape", "step_time",
           "DEFAULT_EFFICIENCY"]

DEFAULT_EFFICIENCY = 0.5


@dataclass(frozen=True)
class Links:
    """Per-GPU, per-direction bandwidth in bytes/s: inside a node and across nodes."""

    intra_bytes_per_s: float
    inter_bytes_per_s: float
    source: str


_DGX_H = "8x ConnectX-7 400 Gb/s per node, one per GPU (DGX H100/H200 datasheet): 50 GB/s"
LINKS: dict[str, Links] = {
    "H100 SXM": Links(450e9, 50e9, "H100 SXM datasheet: NVLink 900 GB/s (both directions) "
                      f"-> 450 GB/s per direction; {_DGX_H}"),
    "H200 SXM": Links(450e9, 50e9, f"H200 datasheet: NVLink 900 GB/s -> 450 per direction; "
                      f"{_DGX_H}"),
    "H800 SXM": Links(200e9, 50e9, "H800 SXM: NVLink 400 GB/s -> 200 per direction; "
                      "400 Gb/s NIC per GPU"),
    "A100": Links(300e9, 25e9, "A100 SXM4 datasheet: NVLink 600 GB/s -> 300 per direction; "
                  "DGX A100: 8x 200 Gb/s HDR, one per GPU: 25 GB/s"),
    "A800": Links(200e9, 25e9, "A800 SXM4: NVLink 400 GB/s -> 200 per direction; 200 Gb/s "
                  "NIC per GPU"),
    "B200": Links(900e9, 50e9, "HGX B200 datasheet: NVLink 5 1.8 TB/s per GPU -> 900 per "
                  "direction; DGX B200: 8x 400 Gb/s ConnectX-7: 50 GB/s"),
    "GB200": Links(900e9, 100e9, "GB200 NVL72 datasheet: NVLink 5 1.8 TB/s per GPU over 72 "
                   "GPUs (give --devices-per-node 72); 800 Gb/s ConnectX-8 per GPU: 100 GB/s"),
}


def links_for(device: str) -> Links | None:
    """Default links of a table device (canonical name), or None (then give them)."""
    return LINKS.get(device)


@dataclass(frozen=True)
class LayoutShape:
    """What the time model needs of a layout."""

    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    zero: int
    recompute: str
    micro_batch: int
    num_microbatches: int
    grad_bytes: float  # bytes per gradient element (2 bf16, 4 fp32)
    dense_params: float  # non-expert parameters on the device
    expert_params: float  # routed-expert parameters on the device


@dataclass(frozen=True)
class StepEstimate:
    """Seconds per step and its parts; ``comm`` maps a dimension to (total, exposed) s."""

    step_s: float
    compute_s: float
    bubble_s: float
    comm: dict[str, tuple[float, float]]
    tokens_per_s: float
    mfu: float
    efficiency: float

    def to_dict(self) -> dict[str, object]:
        return {"step_s": self.step_s, "compute_s": self.compute_s, "bubble_s": self.bubble_s,
                "tokens_per_s": self.tokens_per_s, "mfu": self.mfu,
                "compute_efficiency": self.efficiency,
                "comm_s": {k: {"total": t, "exposed": e} for k, (t, e) in self.comm.items()}}


def _bw(links: Links, span: int, devices_per_node: int) -> float:
    return links.intra_bytes_per_s if span <= devices_per_node else links.inter_bytes_per_s


def step_time(spec: ModelSpec, lay: LayoutShape, *, global_batch: int, peak_flops: float,
              model_flops_per_token: float, hardware_flops_per_token: float, links: Links,
              devices_per_node: int = 8, efficiency: float = DEFAULT_EFFICIENCY,
              attention_flops_per_token: float = 0.0) -> StepEstimate:
    """Estimated seconds per optimizer step of ``lay`` (see the module docstring)."""
    if not 0 < efficiency <= 1:
        raise ConfigError(f"compute efficiency must be in (0, 1], got {efficiency}")
    devices = lay.dp * lay.tp * lay.pp * lay.cp
    tokens = global_batch * spec.seq_len
    compute = tokens * hardware_flops_per_token / (devices * peak_flops * efficiency)
    m, p = lay.num_microbatches, lay.pp
    per_mb = compute / m
    act = spec.seq_len / lay.cp * lay.micro_batch * spec.hidden * 2.0  # bf16 activations
    layers = spec.layers / p
    comm: dict[str, tuple[float, float]] = {}
    if lay.tp > 1:
        n_ar = 6 if lay.recompute == "full" else 4
        t = layers * m * n_ar * 2 * (lay.tp - 1) / lay.tp * act / _bw(links, lay.tp,
                                                                     devices_per_node)
        comm["tp"] = (t, t)
    if lay.ep > 1:
        moe_layers = spec.moe_layers / p
        t = (moe_layers * m * 4 * (lay.ep - 1) / lay.ep * act * spec.moe_top_k
             / _bw(links, lay.tp * lay.ep, devices_per_node))
        comm["ep"] = (t, t)
    if lay.cp > 1:
        kv = (spec.seq_len / lay.cp) * lay.micro_batch * 2 * spec.kv_width * 2.0
        t = layers * m * 3 * (lay.cp - 1) * kv / _bw(links, lay.tp * lay.cp, devices_per_node)
        window = compute * attention_flops_per_token / hardware_flops_per_token
        comm["cp"] = (t, max(0.0, t - window))
    if p > 1:
        t = m * 2 * act / _bw(links, devices, devices_per_node)
        comm["pp"] = (t, t)
    stage = compute + sum(e for k, (_, e) in comm.items() if k in ("tp", "ep", "cp", "pp"))
    bubbled = stage * (m + p - 1) / m
    _data_parallel(lay, comm, links, devices_per_node, per_mb, m)
    step = bubbled + sum(e for k, (_, e) in comm.items() if k in ("dp", "zero3"))
    return StepEstimate(step_s=step, compute_s=compute, bubble_s=bubbled - stage, comm=comm,
                        tokens_per_s=tokens / step,
                        mfu=tokens * model_flops_per_token / (step * devices * peak_flops),
                        efficiency=efficiency)


def _data_parallel(lay: LayoutShape, comm: dict[str, tuple[float, float]], links: Links,
                   devices_per_node: int, per_mb: float, m: int) -> None:
    """Gradient reduction over DP x CP (experts over EDP); ZeRO-3 parameter gathers."""
    d = lay.dp * lay.cp
    edp = d * lay.tp // (lay.tp * lay.ep)  # expert tensor parallel = tp
    span = lay.tp * d
    t = 0.0
    if d > 1:
        t += 2 * (d - 1) / d * lay.dense_params * lay.grad_bytes / _bw(links, span,
                                                                        devices_per_node)
    if edp > 1 and lay.expert_params:
        t += (2 * (edp - 1) / edp * lay.expert_params * lay.grad_bytes
              / _bw(links, span, devices_per_node))
    if t:
        comm["dp"] = (t, max(0.0, t - per_mb * 2 / 3))  # overlaps the last backward
    if lay.zero == 3 and d > 1:
        gather = (2 * (d - 1) / d * (lay.dense_params + lay.expert_params) * 2.0
                  / _bw(links, span, devices_per_node))  # forward + backward all-gathers
        comm["zero3"] = (gather * m, max(0.0, gather - per_mb) * m)
