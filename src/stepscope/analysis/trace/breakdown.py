"""Trace breakdown: one entry point, :func:`analyze`, from event tables to a TraceReport.

Per rank: the rank-level temporal breakdown and comm/compute overlap (``overlap.py``),
the per-step phase rows (``steps.py``); over ranks: the op ranking (``ops.py``) and the
slowest rank with the phase that differs. Pure: returns data, never prints.

Example::

    from stepscope.traces import read_trace
    from stepscope.analysis.trace.breakdown import analyze
    report = analyze(read_trace("profiles/run1"), hta_compatible=True)
    report.to_dict()["ranks"]["0"]["idle_pct"]
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..._ranges import StepRange
from ..._ranges import parse_step_range as parse_steps  # the one a:b parser (old path)
from ...errors import ConfigError
from ...schema import EventTable
from ...traces.kineto import COMM_LOOKED_FOR
from ..health.config import straggler_scores
from .ops import OpPartial, OpRow, has_device_work, op_partial, op_rows
from .overlap import Temporal, exact_temporal, hta_temporal, step_table, stream_busy
from .steps import BAR_PHASES, StepRow, step_rows

__all__ = ["TraceReport", "RankReport", "RankComparison", "analyze", "parse_steps",
           "EXACT_DIFFERENCES", "NO_COMM_MESSAGE", "Plan", "RankPart", "table_facts",
           "plan_analysis", "rank_part", "combine_parts"]

NO_COMM_MESSAGE = f"no communication found (looked for: {COMM_LOOKED_FOR})"
# How the default (exact) convention differs from HTA 0.5.0; printed with every report.
EXACT_DIFFERENCES: tuple[str, ...] = (
    "exact float timestamps (HTA rounds ns-resolution times inward to whole µs)",
    "whole ProfilerSteps, the last one included (HTA drops the last step); device work "
    "belongs to the step whose host launch it came from",
    "communication = NCCL/RCCL/MSCCL kernels under any spelling and kernels with a "
    "'Collective name' arg (HTA: only names matching ^nccl.*Kernel)",
    "device sync waits (cuda_sync: Stream Sync, Event Sync, Context Sync, Stream Wait Event) "
    "are not busy time (HTA counts them, some as compute)",
)
HTA_NOTE = ("HTA 0.5.0 conventions: default window drops the last ProfilerStep by CPU-GPU "
            "correlation, float timestamps rounded inward to whole µs, kernels classified "
            "by HTA's name rules")


@dataclass(frozen=True)
class RankReport:
    """One rank: temporal breakdown over its window and its step rows."""

    rank: int
    source: str
    temporal: Temporal | None
    steps: list[StepRow]
    no_comm_note: str = NO_COMM_MESSAGE  # what the reader looked for, when it found none
    stream_busy_us: dict[int, float] = field(default_factory=dict)  # per device stream

    def phase_means_us(self) -> dict[str, float]:
        if not self.steps:
            return {}
        return {p: float(np.mean([getattr(r, f"{p}_us") for r in self.steps]))
                for p in BAR_PHASES}

    def step_time_median_us(self) -> float | None:
        return float(np.median([r.step_time_us for r in self.steps])) if self.steps else None

    def to_dict(self) -> dict[str, Any]:
        t = self.temporal
        pct: dict[str, Any] = t.pct() if t else {
            "idle_pct": None, "compute_pct": None, "non_compute_pct": None,
            "comm_comp_overlap_pct": None}
        out: dict[str, Any] = dict(pct)
        out.update(
            view=t.view if t else None, convention=t.convention if t else None,
            window_us=t.window_us if t else None, idle_us=t.idle_us if t else None,
            compute_us=t.compute_us if t else None,
            non_compute_us=t.non_compute_us if t else None,
            comm_us=t.comm_us if t else None, comm_overlap_us=t.overlap_us if t else None,
            comm_note=None if (t and t.comm_us > 0) else self.no_comm_note,
            step_time_median_us=self.step_time_median_us(),
            phase_means_us=self.phase_means_us(), source=self.source,
            stream_busy_us={str(k): v for k, v in sorted(self.stream_busy_us.items())},
            steps=[r.to_dict() for r in self.steps],
        )
        return out


@dataclass(frozen=True)
class RankComparison:
    """Across ranks: the slowest rank and the phase in which the straggler differs."""

    slowest_rank: int
    fastest_rank: int
    slower_by_pct: float  # median step time, slowest vs fastest
    straggler_rank: int  # lowest straggler score of working time (step minus comm and idle)
    differing_phase: str
    phase_delta_us: float  # straggler minus the mean of the other ranks, per step
    phase_deltas_us: dict[str, float]
    # health.config.straggler_scores of the working time; None when no rank works > 0 µs.
    # Below HealthConfig.straggler_score the rank is a straggler (diagnose says so).
    straggler_score: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class TraceReport:
    """What ``stepscope trace`` shows; ``to_dict()`` is its ``--json`` output."""

    ranks: dict[int, RankReport]
    top_ops: list[OpRow]
    comparison: RankComparison | None
    hta_compatible: bool
    conventions: list[str]
    warnings: list[str] = field(default_factory=list)
    all_ops: list[OpRow] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "ranks": {str(r): rep.to_dict() for r, rep in sorted(self.ranks.items())},
            "top_ops": [o.to_dict() for o in self.top_ops],
            "comparison": self.comparison.to_dict() if self.comparison else None,
            "hta_compatible": self.hta_compatible,
            "conventions": list(self.conventions),
            "warnings": list(self.warnings),
        }


def analyze(tables: Sequence[EventTable], hta_compatible: bool = False,
            steps: tuple[int | None, int | None] | Collection[int] | None = None,
            top: int = 20) -> TraceReport:
    """Break down traces (one EventTable per rank) into a TraceReport.

    ``hta_compatible``: rank-level idle/compute/non-compute/overlap follow HTA 0.5.0 exactly
    (its default window); otherwise exact times over whole steps (``EXACT_DIFFERENCES``).
    ``steps``: a tuple (a, b) of ProfilerStep numbers, both included, either may be None;
    or a set/list of step numbers.

    Example::

        rep = analyze(read_trace("ddp2_gloo_basic"), steps=(2, 3))
        rep.ranks[0].steps[0].backward_us
    """
    if not tables:
        raise ConfigError("analyze() needs at least one event table (one per rank)")
    facts = [table_facts(t) for t in tables]
    plan = plan_analysis(facts, hta_compatible, steps)
    device = any(has_device_work(t, plan.chosen) for t in tables)
    parts = [rank_part(t, i, plan, device) for i, t in enumerate(tables)]
    return combine_parts(parts, plan, device, top)


@dataclass(frozen=True)
class Plan:
    """What every rank's part needs to know of all ranks (computed from their facts)."""

    hta_compatible: bool
    chosen: set[int] | None  # selected ProfilerStep numbers (None: all)
    multi_ps: bool  # the traces name more than one ProfilerStep (HTA's step filter)
    no_step_warning: str | None


@dataclass(frozen=True)
class RankPart:
    """One rank's share of a TraceReport: all a worker sends back (no event table)."""

    rank: int
    report: RankReport
    warnings: list[str]
    ops: OpPartial


def table_facts(t: EventTable) -> dict[str, Any]:
    """The little of a rank's table the plan needs: its step numbers and ProfilerStep names."""
    return {"steps": sorted(int(k) for k in step_table(t)),
            "ps_names": sorted({n for n in t.names if "ProfilerStep" in n})}


def plan_analysis(facts: Sequence[dict[str, Any]], hta_compatible: bool,
                  steps: tuple[int | None, int | None] | Collection[int] | None) -> Plan:
    chosen: set[int] | None = None
    known = {k for f in facts for k in f["steps"]}
    if steps is not None:
        if isinstance(steps, tuple) and len(steps) == 2:  # a range; sets/lists are numbers
            rng = StepRange(*steps)
            chosen = {k for k in known if k in rng}
        else:
            chosen = {int(s) for s in steps if s is not None}
    warning = (f"--steps selects no ProfilerStep of this trace (has: {sorted(known)})"
               if chosen is not None and not chosen else None)
    ps_names = {n for f in facts for n in f["ps_names"]}
    return Plan(hta_compatible, chosen, len(ps_names) > 1, warning)


def rank_part(t: EventTable, index: int, plan: Plan, device: bool) -> RankPart:
    """One rank's report, warnings and op totals (``index``: its place among the ranks)."""
    rank = int(t.meta.get("rank", index))
    warnings: list[str] = []
    chosen = plan.chosen
    if plan.hta_compatible:
        temporal = hta_temporal(t, filter_steps=plan.multi_ps)
        if temporal is None:
            warnings.append(f"rank {rank}: HTA's breakdown is undefined here (no GPU "
                            "events, or no ProfilerStep on this rank); stepscope's "
                            "exact numbers are shown instead")
            temporal = exact_temporal(t, chosen)
    else:
        temporal = exact_temporal(t, chosen)
    report = RankReport(rank, str(t.meta.get("path", "")), temporal, step_rows(t, chosen),
                        _no_comm_note(t), stream_busy(t, chosen))
    warnings.extend(_rank_warnings(rank, t, report))
    return RankPart(rank, report, warnings, op_partial(t, chosen, device))


def combine_parts(parts: Sequence[RankPart], plan: Plan, device: bool, top: int = 20
                  ) -> TraceReport:
    """The TraceReport of the ranks' parts, in rank order (what :func:`analyze` returns)."""
    warnings = [plan.no_step_warning] if plan.no_step_warning else []
    ranks: dict[int, RankReport] = {}
    for p in parts:
        ranks[p.rank] = p.report
        warnings.extend(p.warnings)
    if plan.hta_compatible and plan.chosen is not None:
        warnings.append("--steps applies to the per-step rows; the HTA-compatible rank "
                        "numbers use HTA's own window")
    all_ops = op_rows([p.ops for p in parts], device)
    return TraceReport(
        ranks=ranks, top_ops=all_ops[:top], comparison=compare_ranks(ranks),
        hta_compatible=plan.hta_compatible,
        conventions=[HTA_NOTE] if plan.hta_compatible else list(EXACT_DIFFERENCES),
        warnings=warnings, all_ops=all_ops)


def _no_comm_note(t: EventTable) -> str:
    """The reader's own "no communication found (looked for: ...)" when it has one."""
    for w in t.meta.get("warnings") or []:
        if isinstance(w, str) and w.startswith("no communication found"):
            return w
    return NO_COMM_MESSAGE


def _rank_warnings(rank: int, t: EventTable, rep: RankReport) -> list[str]:
    out = []
    if rep.temporal is None:
        out.append(f"rank {rank}: no events in the selected window")
    elif rep.temporal.comm_us <= 0:
        out.append(f"rank {rank}: {rep.no_comm_note}")
    out.extend(f"rank {rank}: {w}" for w in t.meta.get("warnings") or []
               if isinstance(w, str) and w != rep.no_comm_note)
    if not rep.steps and not step_table(t):
        out.append(f"rank {rank}: no ProfilerStep#N markers; no per-step rows (profile "
                   "with a schedule and call prof.step() each iteration)")
    for key in ("step_source", "phase_source"):
        if t.meta.get(key):
            out.append(f"rank {rank}: {key.replace('_', ' ')}: {t.meta[key]}")
    inferred = sorted({r.step for r in rep.steps if r.backward_source == "autograd events"})
    if inferred:
        out.append(f"rank {rank}: no backward annotation in steps {inferred}; backward "
                   "inferred from autograd engine events")
    if t.meta.get("skipped_events"):
        out.append(f"rank {rank}: {t.meta['skipped_events']} events without a usable "
                   "ts/dur were skipped")
    if t.meta.get("rejected_durations"):
        out.append(f"rank {rank}: {t.meta['rejected_durations']} events with a negative or "
                   "implausible duration (over 1e11 us) were rejected")
    out.extend(f"skipped {w}" for w in t.meta.get("skipped_files") or [])
    return out


def compare_ranks(ranks: dict[int, RankReport]) -> RankComparison | None:
    """Slowest rank by median step time; straggler = the rank whose working time scores
    lowest (:func:`~stepscope.analysis.health.config.straggler_scores`): the one that
    works longest."""
    med = {r: rep.step_time_median_us() for r, rep in ranks.items()}
    timed = {r: m for r, m in med.items() if m is not None}
    if len(timed) < 2:
        return None
    means = {r: ranks[r].phase_means_us() for r in timed}
    slowest = max(timed, key=lambda r: timed[r])
    fastest = min(timed, key=lambda r: timed[r])
    # Waiting on peers shows up as exposed comm or idle; everything else is the rank's own
    # work (a slow data loader included), so the straggler is the rank that works longest
    # and the phase that differs is the work phase it spends most extra time in.
    work = {r: timed[r] - means[r]["comm_exposed"] - means[r]["idle"] for r in timed}
    scores = straggler_scores(work)
    straggler = (min(scores, key=lambda r: scores[r]) if scores
                 else max(work, key=lambda r: work[r]))
    others = [r for r in timed if r != straggler]
    deltas = {p: means[straggler][p] - float(np.mean([means[o][p] for o in others]))
              for p in BAR_PHASES}
    own = {p: d for p, d in deltas.items() if p not in ("comm_exposed", "idle") and d > 0}
    phase = max(own, key=lambda p: own[p]) if own else max(deltas, key=lambda p: abs(deltas[p]))
    return RankComparison(
        slowest_rank=slowest, fastest_rank=fastest,
        slower_by_pct=round(100.0 * (timed[slowest] - timed[fastest]) / timed[fastest], 2)
        if timed[fastest] > 0 else 0.0,
        straggler_rank=straggler, differing_phase=phase, phase_delta_us=deltas[phase],
        phase_deltas_us=deltas, straggler_score=scores.get(straggler))

