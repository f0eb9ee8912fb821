"""Diff of two traces (or two archived profiles): per op name and per phase.

Both sides are normalised per step (per rank-step when there are several ranks), so a
profile of 3 steps compares fairly with one of 5. An op or phase is ``slower``/``faster``
when it moved by at least ``REL_THRESHOLD`` of the larger side and ``ABS_THRESHOLD_US`` per
step; otherwise ``same``. Ops present on one side only are ``added``/``removed``.

Ops are matched by name, or by op type (``by="type"``: every ``Conv2DBackpropFilter`` of a
side summed into one row). ``by="auto"`` matches by type when either side's names are more
than their types (MindSpore: ``Gradients/.../Conv2D-op3`` in graph mode, ``Default/Conv2D-op0``
in PyNative: the names of one op differ between the modes, its type does not), else by name
(PyTorch names are their own type). ``TraceDiff.matched_by`` says which.

Example::

    from stepscope.analysis.trace.breakdown import analyze
    d = diff_reports(analyze(read_trace("base")), analyze(read_trace("test")))
    [o.name for o in d.ops if o.status == "slower"]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from .breakdown import TraceReport
from .ops import OpRow
from .steps import BAR_PHASES

__all__ = ["OpDelta", "PhaseDelta", "TraceDiff", "diff_reports", "match_by", "REL_THRESHOLD",
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
    matched_by: str = "name"  # name | type: what an op row of ``ops`` is

    def to_dict(self) -> dict[str, Any]:
        return {"a_steps": self.a_steps, "b_steps": self.b_steps, "matched_by": self.matched_by,
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


def _by_key(rows: list[OpRow], by: str) -> dict[str, OpRow]:
    """Rows keyed by name, or summed per op type (kind and place of the largest row)."""
    if by == "name":
        return {o.name: o for o in rows}
    out: dict[str, OpRow] = {}
    for o in sorted(rows, key=lambda o: -max(o.total_us, o.self_us)):
        key = o.op_type or o.name
        prev = out.get(key)
        if prev is None:
            out[key] = replace(o, name=key)
            continue
        count = prev.count + o.count
        out[key] = replace(prev, count=count, total_us=prev.total_us + o.total_us,
                           self_us=prev.self_us + o.self_us,
                           mean_us=(prev.total_us + o.total_us) / max(count, 1),
                           share_pct=prev.share_pct + o.share_pct)
    return out


def match_by(a: TraceReport, b: TraceReport, by: str = "auto") -> str:
    """``name`` or ``type``: what ``diff_reports`` matches ops by (see the module doc)."""
    if by in ("name", "type"):
        return by
    if by != "auto":
        raise ValueError(f"by must be auto, name or type, got {by!r}")
    typed = any(o.op_type and o.op_type != o.name for o in [*a.all_ops, *b.all_ops])
    return "type" if typed else "name"


def diff_reports(a: TraceReport, b: TraceReport, limit: int = 50,
                 by: str = "auto") -> TraceDiff:
    """Compare report ``b`` against baseline ``a`` (ops: ``all_ops`` of each report),
    ops matched by name or by op type (``by``: auto | name | type)."""
    na, nb = max(_rank_steps(a), 1), max(_rank_steps(b), 1)
    phases = [PhaseDelta(p, _mean_phase(a, p), _mean_phase(b, p),
                         _mean_phase(b, p) - _mean_phase(a, p),
                         _status(_mean_phase(a, p), _mean_phase(b, p))) for p in BAR_PHASES]
    key = match_by(a, b, by)
    ops_a = _by_key(a.all_ops, key)
    ops_b = _by_key(b.all_ops, key)
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
                     out[:limit], matched_by=key)
