"""Scaling efficiency: does throughput grow linearly with more cards? (field report)

For runs that differ only in device count: throughput per device and the scaling
efficiency against the smallest run,

    efficiency(n) = (tokens/s at n devices / n) / (tokens/s at n0 devices / n0)

(1.0 = linear scaling), with the exposed-communication share beside it, since
communication is what usually eats the difference. Metrics come from
``summary.summarize`` (samples/s when a run has no token counts).

The batch variables follow the device count in any scaling study (weak scaling keeps the
per-device batch, strong scaling keeps the global batch), so ``num_devices``, ``dp``,
``global_batch``, ``micro_batch`` and ``grad_accum`` may differ; any other differing
baseline variable is listed in ``differing`` because it, not the card count, may explain
the numbers.

Example::

    result = scaling([("8 cards", t8, m8), ("64 cards", t64, m64)])
    [p.efficiency for p in result.points]      # [1.0, 0.82]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ...errors import ConfigError
from ...schema import RunMeta, StepTable
from ..summary import summarize
from .runs import Difference, diff_fingerprints

__all__ = ["ScalingPoint", "ScalingResult", "scaling", "SCALING_VARIABLES"]

SCALING_VARIABLES = ("num_devices", "dp", "global_batch", "micro_batch", "grad_accum")


@dataclass
class ScalingPoint:
    name: str
    num_devices: int
    throughput: float | None  # tokens/s (or samples/s, see ScalingResult.unit)
    throughput_per_device: float | None
    efficiency: float | None  # per-device throughput / the smallest run's
    step_time_s: float | None
    comm_share: float | None  # exposed communication share when measured, else total
    mfu: float | None
    global_batch: Any = None


@dataclass
class ScalingResult:
    unit: str  # "tokens/s" | "samples/s"
    mode: str  # "weak" | "strong" | "mixed" | "unknown"
    points: list[ScalingPoint]
    differing: list[Difference] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"unit": self.unit, "mode": self.mode,
                "points": [asdict(p) for p in self.points],
                "differing": [d.to_dict() for d in self.differing]}


def _mode(points: Sequence[ScalingPoint]) -> str:
    batches = [p.global_batch for p in points]
    if any(not isinstance(b, (int, float)) for b in batches):
        return "unknown"
    if len(set(batches)) == 1:
        return "strong"
    per_dev = {round(float(b) / p.num_devices, 9) for b, p in zip(batches, points, strict=True)}
    return "weak" if len(per_dev) == 1 else "mixed"


def scaling(runs: Sequence[tuple[str, StepTable, RunMeta]]) -> ScalingResult:
    """Per-device throughput and efficiency vs the smallest run. Pure.

    Raises ConfigError when fewer than two runs are given.
    """
    if len(runs) < 2:
        raise ConfigError(f"scaling needs at least two runs with different device counts; "
                          f"got {len(runs)}")
    sheets = [(name, summarize(t, m), m) for name, t, m in runs]
    unit = "tokens/s" if all(s.tokens_per_s for _, s, _ in sheets) else "samples/s"
    points = []
    for name, s, m in sheets:
        devices = int(m.baseline.get("num_devices") or s.ranks or 1)
        tput = s.tokens_per_s if unit == "tokens/s" else s.samples_per_s
        comm = s.comm_exposed_frac if s.comm_exposed_frac is not None else s.comm_frac
        points.append(ScalingPoint(
            name=name, num_devices=devices, throughput=tput,
            throughput_per_device=tput / devices if tput else None, efficiency=None,
            step_time_s=s.step_time_s, comm_share=comm, mfu=s.mfu,
            global_batch=m.baseline.get("global_batch")))
    order = sorted(range(len(points)), key=lambda i: points[i].num_devices)
    points = [points[i] for i in order]
    ref = points[0].throughput_per_device
    for p in points:
        if ref and p.throughput_per_device is not None:
            p.efficiency = p.throughput_per_device / ref
    base_meta = sheets[order[0]][2]
    differing: dict[str, Difference] = {}
    for i in order[1:]:
        for d in diff_fingerprints(base_meta, sheets[i][2])[0]:
            if d.variable not in SCALING_VARIABLES:
                differing.setdefault(d.variable, d)
    return ScalingResult(unit=unit, mode=_mode(points), points=points,
                         differing=list(differing.values()))
