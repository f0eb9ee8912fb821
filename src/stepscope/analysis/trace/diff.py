"""Diff of two traces (or two archived profiles): per op name and per phase.

Both sides are normalised per step (per rank-step when there are several ranks), so a
profile of 3 steps compares fairly with one of 5. An op or phase is ``slower``/``faster``
when it moved by at least ``REL_THRESHOLD`` of the larger side and ``ABS_THRESHOLD_US`` per
step; otherwise ``same``. Ops present on one side only are ``added``/``removed``.

Example::

    from stepscope.analysis.trace.breakdown import analyze
    d = diff_reports(analyze(read_trace("base")), analyze(read_trace("test")))
    [o.name for o in d.ops if o.status == "slower"]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from .breakdown import TraceReport
from .steps import BAR_PHASES

__all__ = ["OpDelta", "PhaseDelta", "TraceDiff", "diff_reports", "REL_THRESHOLD",
           "ABS_THRESHOLD_US"]

# Noise floor for calling a change: profiles of the same code on a shared machine differ by
# a few percent step to step (see the CPU fixtures' README: 0.8-1.2 s steps), so 5 % and
# 1 µs per step. A stepscope choice, not a literature value.
REL_THRESHOLD = 0.05
ABS_THRESHOLD_US = 1.0


@dataclass(frozen=True)
class OpDelta:
    name: str
    kind: str
    a_us_per_step: float
    b_us_per_step: float
    a_count_per_step: float
    b_count_per_step: float
    delta_us_per_step: float
    status: str  # added | removed | slower | faster | same

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PhaseDelta:
    phase: str
    a_us: float
    b_us: float
    delta_us: float
    status: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class TraceDiff:
    a_steps: int
    b_steps: int
    step_time_a_us: float | None
    step_time_b_us: float | None
    phases: list[PhaseDelta]
    ops: list[OpDelta]

    def to_dict(self) -> dict[str, Any]:
        return {"a_steps": self.a_steps, "b_steps": self.b_steps,
                "step_time_a_us": self.step_time_a_us, "step_time_b_us": self.step_time_b_us,
                "phases": [p.to_dict() for p in self.phases],
                "ops": [o.to_dict() for o in self.ops]}


def _status(a: float, b: float) -> str:
    d = b - a
    if abs(d) < ABS_THRESHOLD_US or abs(d) < REL_THRESHOLD * max(abs(a), abs(b)):
        return "same"
    return "slower" if d > 0 else "faster"


def _rank_steps(rep: TraceReport) -> int:
    return sum(len(r.steps) for r in rep.ranks.values())


def _mean_phase(rep: TraceReport, phase: str) -> float:
    rows = [getattr(s, f"{phase}_us") for r in rep.ranks.values() for s in r.steps]
    return sum(rows) / len(rows) if rows else 0.0


def _mean_step(rep: TraceReport) -> float | None:
    rows = [s.step_time_us for r in rep.ranks.values() for s in r.steps]
    return sum(rows) / len(rows) if rows else None


def diff_reports(a: TraceReport, b: TraceReport, limit: int = 50) -> TraceDiff:
    """Compare report ``b`` against baseline ``a`` (ops: ``all_ops`` of each report)."""
    na, nb = max(_rank_steps(a), 1), max(_rank_steps(b), 1)
    phases = [PhaseDelta(p, _mean_phase(a, p), _mean_phase(b, p),
                         _mean_phase(b, p) - _mean_phase(a, p),
                         _status(_mean_phase(a, p), _mean_phase(b, p))) for p in BAR_PHASES]
    ops_a = {o.name: o for o in a.all_ops}
    ops_b = {o.name: o for o in b.all_ops}
    out = []
    for name in ops_a.keys() | ops_b.keys():
        oa, ob = ops_a.get(name), ops_b.get(name)
        ta = (oa.total_us if oa.where == "device" else oa.self_us) / na if oa else 0.0
        tb = (ob.total_us if ob.where == "device" else ob.self_us) / nb if ob else 0.0
        status = "added" if oa is None else "removed" if ob is None else _status(ta, tb)
        either = ob if ob is not None else oa
        kind = either.kind if either is not None else "cpu"
        out.append(OpDelta(name, kind, ta, tb, oa.count / na if oa else 0.0,
                           ob.count / nb if ob else 0.0, tb - ta, status))
    out.sort(key=lambda o: (-abs(o.delta_us_per_step), o.name))
    return TraceDiff(_rank_steps(a), _rank_steps(b), _mean_step(a), _mean_step(b), phases,
                     out[:limit])
