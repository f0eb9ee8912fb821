"""Parallel layouts that fit a device, ranked by estimated step time.

Layouts are enumerated over TP x PP x CP x EP x DP, the ZeRO-equivalent stages the framework
offers (:mod:`stepscope.calc.frameworks`), recompute and micro-batch; each is checked with
:func:`stepscope.calc.memory.estimate` (the numbers ``stepscope memory`` prints for the
layout's flags), kept when ``total <= device memory x (1 - headroom)``, timed with
:func:`stepscope.calc.steptime.step_time` (compute at a stated efficiency, communication
from message sizes and link bandwidths, the 1F1B bubble (p-1)/(m+p-1)) and ranked by that
time, fastest first. Per (TP, PP, CP, EP, ZeRO) only the fastest recompute / micro-batch
variant is kept. TP runs inside a node (``devices_per_node``) with sequence parallelism.

Example::

    layouts = plan(llama2_70b, devices=64, device_memory_bytes=80e9, global_batch=512,
                   peak_flops=989.5e12, links=LINKS["H100 SXM"], framework="megatron")
    layouts[0].estimate.step_s, layouts[0].flags()
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from .flops import flops_per_token
from .frameworks import Framework, launch_settings
from .frameworks import framework as get_framework
from .memory import MemoryEstimate, canonical_precision, check_layout, estimate
from .model import ModelSpec
from .steptime import DEFAULT_EFFICIENCY, LayoutShape, Links, StepEstimate, step_time

__all__ = ["Layout", "plan", "smallest_need", "DEFAULT_HEADROOM"]

# Share of device memory left free for the allocator's fragmentation, NCCL buffers and the
# framework's workspace, which the formulas do not model. A conventional margin, not a
# measured one: pass --headroom to change it.
DEFAULT_HEADROOM = 0.10


@dataclass(frozen=True)
class Layout:
    """One feasible layout: memory per device, estimated step time, launch settings."""

    dp: int
    tp: int
    pp: int
    zero: int
    recompute: str
    micro_batch: int
    sequence_parallel: bool
    num_microbatches: int | None
    bubble_fraction: float
    memory: MemoryEstimate
    free_bytes: float
    why: str
    cp: int = 1
    ep: int = 1
    framework: str = "megatron"
    estimate: StepEstimate | None = None
    settings: str = ""
    memory_args: dict[str, Any] = field(default_factory=dict, compare=False)

    def flags(self) -> str:
        """The ``stepscope memory`` flags that reproduce :attr:`memory`."""
        out = (f"--dp {self.dp} --tp {self.tp} --pp {self.pp} --zero {self.zero} "
               f"--recompute {self.recompute} --micro-batch {self.micro_batch}")
        if self.cp > 1:
            out += f" --cp {self.cp}"
        if self.ep > 1:
            out += f" --ep {self.ep}"
        if self.sequence_parallel:
            out += " --sequence-parallel"
        if self.num_microbatches is not None and self.pp > 1:
            out += f" --num-microbatches {self.num_microbatches}"
        args = self.memory_args
        if args.get("convention", "zero") != "zero":
            out += f" --convention {args['convention']}"
        if args.get("optimizer", "adam") != "adam":
            out += f" --optimizer {args['optimizer']}"
        if args.get("precision", "bf16-mixed") != "bf16-mixed":
            out += f" --precision {args['precision']}"
        if not args.get("flash_attention", True):
            out += " --attention-scores stored"
        return out

    def to_dict(self) -> dict[str, object]:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "cp": self.cp, "ep": self.ep,
                "zero": self.zero, "recompute": self.recompute,
                "micro_batch": self.micro_batch, "sequence_parallel": self.sequence_parallel,
                "num_microbatches": self.num_microbatches,
                "bubble_fraction": self.bubble_fraction, "free_bytes": self.free_bytes,
                "memory": self.memory.to_dict(), "flags": self.flags(), "why": self.why,
                "framework": self.framework, "settings": self.settings,
                "estimate": self.estimate.to_dict() if self.estimate else None}


@dataclass(frozen=True)
class _Context:
    spec: ModelSpec
    fw: Framework
    global_batch: int
    budget: float
    peak_flops: float
    links: Links
    devices_per_node: int
    efficiency: float
    mem_args: dict[str, Any]


def plan(spec: ModelSpec, devices: int, device_memory_bytes: float,
         global_batch: int | None = None, *, peak_flops: float | None = None,
         links: Links | None = None, framework: str = "megatron",
         headroom: float = DEFAULT_HEADROOM, devices_per_node: int = 8,
         optimizer: str = "adam", precision: str = "mixed", max_micro_batch: int = 8,
         flash_attention: bool = True, efficiency: float = DEFAULT_EFFICIENCY
         ) -> list[Layout]:
    """Feasible layouts, fastest first (empty when nothing fits: see :func:`smallest_need`)."""
    if devices < 1 or device_memory_bytes <= 0:
        raise ConfigError(f"need devices >= 1 and device memory > 0, got {devices} devices "
                          f"and {device_memory_bytes} bytes")
    if not 0 <= headroom < 1:
        raise ConfigError(f"headroom must be in [0, 1), got {headroom}")
    if global_batch is None or peak_flops is None or links is None:
        raise ConfigError("plan ranks layouts by estimated step time: give the global batch, "
                          "the device (for its peak and links) or --peak-tflops with "
                          "--intra-node-gbps/--inter-node-gbps")
    fw = get_framework(framework)
    mem_args = {"optimizer": optimizer, "precision": canonical_precision(precision),
                "flash_attention": flash_attention, "convention": fw.memory_convention}
    ctx = _Context(spec, fw, global_batch, device_memory_bytes * (1.0 - headroom), peak_flops,
                   links, devices_per_node, efficiency, mem_args)
    best: dict[tuple[int, ...], Layout] = {}
    for tp, pp, cp, ep in _model_parallel_degrees(spec, devices, devices_per_node, fw):
        for layout in _variants(ctx, devices // (tp * pp * cp), tp, pp, cp, ep,
                                max_micro_batch):
            key = (tp, pp, cp, ep, layout.zero)
            if key not in best or _time(layout) < _time(best[key]):
                best[key] = layout
    return sorted(best.values(), key=_time)


def smallest_need(spec: ModelSpec, devices: int, *, devices_per_node: int = 8,
                  optimizer: str = "adam", precision: str = "mixed",
                  flash_attention: bool = True, framework: str = "megatron"
                  ) -> tuple[MemoryEstimate, str]:
    """The least memory per device any layout needs, and its flags (for "nothing fits")."""
    fw = get_framework(framework)
    found: tuple[MemoryEstimate, str] | None = None
    for tp, pp, cp, ep in _model_parallel_degrees(spec, devices, devices_per_node, fw):
        dp = devices // (tp * pp * cp)
        zero = max(fw.stages(tp, pp)) if dp * cp > 1 else 0
        mem = estimate(spec, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, optimizer=optimizer,
                       precision=precision, recompute="full", sequence_parallel=tp > 1,
                       flash_attention=flash_attention, convention=fw.memory_convention)
        if found is None or mem.total_bytes < found[0].total_bytes:
            found = (mem, f"--dp {dp} --tp {tp} --pp {pp} --cp {cp} --ep {ep} --zero {zero} "
                          "--recompute full --micro-batch 1"
                          + (" --sequence-parallel" if tp > 1 else "")
                          + f" --convention {fw.memory_convention}")
    if found is None:
        raise ConfigError(f"no tensor/pipeline split of {devices} devices suits this model "
                          f"({spec.layers} layers, {spec.n_heads} heads, TP <= "
                          f"{devices_per_node} per node)")
    return found


def _model_parallel_degrees(spec: ModelSpec, devices: int, devices_per_node: int,
                            fw: Framework) -> Iterator[tuple[int, int, int, int]]:
    for tp in _divisors(devices):
        if tp > devices_per_node:
            continue
        for pp in _divisors(devices // tp):
            if pp > spec.layers or spec.layers % pp:
                continue  # even layer split only; uneven stages are not modelled
            for cp in _divisors(devices // (tp * pp)) if fw.cp else [1]:
                if cp > 1 and (cp > 8 or spec.seq_len % (2 * cp)):
                    continue  # load-balanced ring attention splits the sequence in 2*cp
                dp = devices // (tp * pp * cp)
                eps = ([e for e in _divisors(spec.moe_experts) if (dp * cp) % e == 0]
                       if fw.ep and spec.moe_experts else [1])
                for ep in eps:
                    try:
                        check_layout(spec, dp, tp, pp, 0, ep, None, cp)
                    except ConfigError:
                        continue
                    yield tp, pp, cp, ep


def _variants(ctx: _Context, dp: int, tp: int, pp: int, cp: int, ep: int,
              max_micro_batch: int) -> Iterator[Layout]:
    zeros = tuple(z for z in ctx.fw.stages(tp, pp) if dp * cp > 1 or z == 0)
    mb = 1
    while mb <= max_micro_batch:
        if ctx.global_batch % (dp * mb) == 0:
            m = ctx.global_batch // (dp * mb)
            for zero in zeros:
                for recompute in ("none", "selective", "full"):
                    mem = estimate(ctx.spec, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero,
                                   micro_batch=mb, recompute=recompute,
                                   sequence_parallel=tp > 1, num_microbatches=m,
                                   **ctx.mem_args)
                    if mem.total_bytes <= ctx.budget:
                        yield _layout(ctx, (dp, tp, pp, cp, ep), zero, recompute, mb, m, mem)
        mb *= 2


def _layout(ctx: _Context, degrees: tuple[int, int, int, int, int], zero: int, recompute: str,
            mb: int, m: int, mem: MemoryEstimate) -> Layout:
    dp, tp, pp, cp, ep = degrees
    spec = ctx.spec
    est = flops_per_token(spec, "megatron", recompute)
    expert = mem.expert_params_per_device
    shape = LayoutShape(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero, recompute=recompute,
                        micro_batch=mb, num_microbatches=m,
                        grad_bytes=4.0 if ctx.fw.name == "megatron" else 2.0,
                        dense_params=mem.params_per_device - expert, expert_params=expert)
    timing = step_time(spec, shape, global_batch=ctx.global_batch, peak_flops=ctx.peak_flops,
                       model_flops_per_token=est.flops_per_token,
                       hardware_flops_per_token=est.hardware_flops_per_token, links=ctx.links,
                       devices_per_node=ctx.devices_per_node, efficiency=ctx.efficiency,
                       attention_flops_per_token=est.attention_flops_per_token)
    bubble = (pp - 1) / (m + pp - 1)
    gib = 2.0 ** 30
    why = (f"{timing.step_s:.2f} s/step, {timing.tokens_per_s:,.0f} tokens/s, MFU "
           f"{timing.mfu:.1%}; bubble {bubble:.0%}; exposed comm "
           + ", ".join(f"{k} {e:.2f} s" for k, (_, e) in timing.comm.items() if e > 0.005)
           + f"; {mem.total_bytes / gib:.1f} GiB/device")
    settings = launch_settings(ctx.fw.name, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, zero=zero,
                               recompute=recompute, micro_batch=mb,
                               global_batch=ctx.global_batch, seq_len=spec.seq_len)
    return Layout(dp=dp, tp=tp, pp=pp, zero=zero, recompute=recompute, micro_batch=mb,
                  sequence_parallel=tp > 1, num_microbatches=m, bubble_fraction=bubble,
                  memory=mem, free_bytes=ctx.budget - mem.total_bytes, why=why, cp=cp, ep=ep,
                  framework=ctx.fw.name, estimate=timing, settings=settings,
                  memory_args=dict(ctx.mem_args))


def _time(layout: Layout) -> tuple[float, float]:
    """Fastest first; at equal time, the one with more free memory."""
    step = layout.estimate.step_s if layout.estimate else float("inf")
    return round(step, 6), layout.memory.total_bytes


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
