"""Parallel layouts that fit a device, ranked by the field report's rule.

The rule (../shared/FIELD-REPORT.md, "Optimization order"): data parallel first; when the model
no longer fits, estimate weights + gradients + optimizer states + activations against device
memory; if it does not fit, split layers (pipeline: less communication, but bubbles); if a
layer still does not fit, split operators (tensor parallel: every matmul adds communication).
Memory remedies in its order: selective recompute, then optimizer-state sharding.

So layouts are enumerated over DP x TP x PP x ZeRO x recompute x micro-batch, each checked with
:func:`stepscope.calc.memory.estimate` (the same numbers ``stepscope memory`` prints), kept
when ``total <= device memory x (1 - headroom)``, and ranked by the key

    (TP, PP, recompute: none < selective < full, ZeRO stage, pipeline bubble, -micro-batch)

i.e. fewest communication-heavy dimensions first (TP before PP because TP communicates inside
every layer). Per (TP, PP, ZeRO) only the best recompute / micro-batch variant is kept.
TP runs inside a node (``devices_per_node``, NVLink domain) and with sequence parallelism
(Korthikanti et al. 2022: it removes the activations TP leaves replicated at no extra
communication volume). Pipeline bubble of 1F1B: (p - 1)/m for m micro-batches
(Narayanan et al. 2021, Sec. 2.2).

Example::

    layouts = plan(llama2_70b, devices=64, device_memory_bytes=80e9, global_batch=512)
    layouts[0].dp, layouts[0].tp, layouts[0].pp, layouts[0].zero     # best first
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError
from .memory import MemoryEstimate, check_layout, estimate
from .model import ModelSpec

__all__ = ["Layout", "plan", "smallest_need", "DEFAULT_HEADROOM"]

# Share of device memory left free for the allocator's fragmentation, NCCL buffers and the
# framework's workspace, which the formulas do not model. A conventional margin, not a
# measured one: pass --headroom to change it.
DEFAULT_HEADROOM = 0.10
_RECOMPUTE_RANK = {"none": 0, "selective": 1, "full": 2}


@dataclass(frozen=True)
class Layout:
    """One feasible layout with its memory per device and why it ranks where it does."""

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

    def flags(self) -> str:
        """The ``stepscope memory`` flags that reproduce :attr:`memory`."""
        out = (f"--dp {self.dp} --tp {self.tp} --pp {self.pp} --zero {self.zero} "
               f"--recompute {self.recompute} --micro-batch {self.micro_batch}")
        if self.sequence_parallel:
            out += " --sequence-parallel"
        if self.num_microbatches is not None and self.pp > 1:
            out += f" --num-microbatches {self.num_microbatches}"
        return out

    def to_dict(self) -> dict[str, object]:
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "zero": self.zero,
                "recompute": self.recompute, "micro_batch": self.micro_batch,
                "sequence_parallel": self.sequence_parallel,
                "num_microbatches": self.num_microbatches,
                "bubble_fraction": self.bubble_fraction, "free_bytes": self.free_bytes,
                "memory": self.memory.to_dict(), "flags": self.flags(), "why": self.why}


def plan(spec: ModelSpec, devices: int, device_memory_bytes: float,
         global_batch: int | None = None, *, headroom: float = DEFAULT_HEADROOM,
         devices_per_node: int = 8, optimizer: str = "adam", precision: str = "mixed",
         max_micro_batch: int = 8, flash_attention: bool = False) -> list[Layout]:
    """Feasible layouts, best first (empty when nothing fits: see :func:`smallest_need`).

    Example: a 70B model on 64 x 80 GB devices -> ZeRO-3 data parallel with recompute first,
    then pipeline layouts, then tensor-parallel ones.
    """
    if devices < 1 or device_memory_bytes <= 0:
        raise ConfigError(f"need devices >= 1 and device memory > 0, got {devices} devices "
                          f"and {device_memory_bytes} bytes")
    if not 0 <= headroom < 1:
        raise ConfigError(f"headroom must be in [0, 1), got {headroom}")
    budget = device_memory_bytes * (1.0 - headroom)
    best: dict[tuple[int, int, int], Layout] = {}
    for tp, pp in _model_parallel_degrees(spec, devices, devices_per_node):
        dp = devices // (tp * pp)
        for layout in _variants(spec, dp, tp, pp, global_batch, max_micro_batch, optimizer,
                                precision, flash_attention, budget):
            key = (tp, pp, layout.zero)
            if key not in best or _rank(layout) < _rank(best[key]):
                best[key] = layout
    return sorted(best.values(), key=_rank)


def smallest_need(spec: ModelSpec, devices: int, *, devices_per_node: int = 8,
                  optimizer: str = "adam", precision: str = "mixed",
                  flash_attention: bool = False) -> tuple[MemoryEstimate, str]:
    """The least memory per device any layout needs, and its flags (for "nothing fits").

    Tries every TP x PP with the most sharding (ZeRO-3 when DP > 1), full recompute and
    micro-batch 1.
    """
    found: tuple[MemoryEstimate, str] | None = None
    for tp, pp in _model_parallel_degrees(spec, devices, devices_per_node):
        dp = devices // (tp * pp)
        zero = 3 if dp > 1 else 0
        mem = estimate(spec, dp=dp, tp=tp, pp=pp, zero=zero, optimizer=optimizer,
                       precision=precision, recompute="full", sequence_parallel=tp > 1,
                       flash_attention=flash_attention)
        if found is None or mem.total_bytes < found[0].total_bytes:
            found = (mem, f"--dp {dp} --tp {tp} --pp {pp} --zero {zero} --recompute full "
                          f"--micro-batch 1" + (" --sequence-parallel" if tp > 1 else ""))
    if found is None:
        raise ConfigError(f"no tensor/pipeline split of {devices} devices suits this model "
                          f"({spec.layers} layers, {spec.n_heads} heads, TP <= "
                          f"{devices_per_node} per node)")
    return found


def _model_parallel_degrees(spec: ModelSpec, devices: int,
                            devices_per_node: int) -> list[tuple[int, int]]:
    out = []
    for tp in _divisors(devices):
        if tp > devices_per_node:
            continue
        for pp in _divisors(devices // tp):
            if pp > spec.layers or spec.layers % pp:
                continue  # even layer split only; uneven stages are not modelled
            try:
                check_layout(spec, devices // (tp * pp), tp, pp)
            except ConfigError:
                continue
            out.append((tp, pp))
    return out


def _variants(spec: ModelSpec, dp: int, tp: int, pp: int, global_batch: int | None,
              max_micro_batch: int, optimizer: str, precision: str, flash: bool,
              budget: float) -> list[Layout]:
    out = []
    zeros = (0, 1, 2, 3) if dp > 1 else (0,)
    mb = 1
    while mb <= max_micro_batch:
        m = None
        if global_batch is not None:
            if global_batch % (dp * mb):
                mb *= 2
                continue
            m = global_batch // (dp * mb)
        for zero in zeros:
            for recompute in ("none", "selective", "full"):
                mem = estimate(spec, dp=dp, tp=tp, pp=pp, zero=zero, optimizer=optimizer,
                               precision=precision, micro_batch=mb, recompute=recompute,
                               sequence_parallel=tp > 1, num_microbatches=m,
                               flash_attention=flash)
                if mem.total_bytes <= budget:
                    out.append(_layout(dp, tp, pp, zero, recompute, mb, m, mem, budget))
        mb *= 2
    return out


def _layout(dp: int, tp: int, pp: int, zero: int, recompute: str, mb: int, m: int | None,
            mem: MemoryEstimate, budget: float) -> Layout:
    bubble = 0.0 if pp == 1 else (pp - 1) / (m if m else pp)
    parts = ["data parallel only" if tp == pp == 1 else
             f"layers split over {pp} pipeline stages" if tp == 1 else
             f"tensor parallel {tp} inside a node" + (f" x {pp} stages" if pp > 1 else "")]
    if zero:
        parts.append(f"ZeRO-{zero} shards " + ("optimizer states", "optimizer states + grads",
                                               "optimizer states + grads + params")[zero - 1])
    if recompute != "none":
        parts.append(f"{recompute} recompute")
    if pp > 1:
        parts.append(f"bubble {bubble:.0%}")
    gib = 2.0 ** 30
    parts.append(f"{mem.total_bytes / gib:.1f} GiB/device ({mem.model_states_bytes / gib:.1f} "
                 f"states + {mem.activations_bytes / gib:.1f} activations)")
    return Layout(dp=dp, tp=tp, pp=pp, zero=zero, recompute=recompute, micro_batch=mb,
                  sequence_parallel=tp > 1, num_microbatches=m, bubble_fraction=bubble,
                  memory=mem, free_bytes=budget - mem.total_bytes, why="; ".join(parts))


def _rank(layout: Layout) -> tuple[float, ...]:
    return (layout.tp, layout.pp, _RECOMPUTE_RANK[layout.recompute], layout.zero,
            layout.bubble_fraction, -layout.micro_batch)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]
