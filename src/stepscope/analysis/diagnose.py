"""Diagnosis: the step table, health findings, recorded experiments and (if any) a trace
breakdown combined into ranked findings, the bottleneck, and advice.

Ranking: severity first, then training health before speed, then impact (the share of
step time a finding costs), then confidence. Findings that explain each other are
reconciled (a straggler explains the other ranks' communication wait; a non-finite step
explains the spikes after it; an isolation experiment confirms or clears the data-wait
suspect). The bottleneck is the performance finding (warning or worse) with the largest
impact, or None for a healthy run.

Example::

    table, _ = RunDir.open(path).read_steps()
    d = diagnose(table, run.read_meta(), events=run.read_events()[0])
    d.bottleneck, d.findings[0].message, d.to_dict()   # to_dict(): the --json contract
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .._fastnp import nansum
from ..findings import CATEGORIES, Finding, severity_rank
from ..schema import RunMeta, StepTable
from .advice import Advice, advise
from .env_evidence import environment_findings, profiler_steps
from .health.check import RULES, HealthConfig, check_health
from .isolation import ISOLATION_EVENT, IsolationResult, isolation_finding
from .op_findings import op_findings
from .regimes import MIN_REGIME_STEPS, Regimes
from .summary import Conditions

__all__ = ["Diagnosis", "diagnose", "health_findings", "PERFORMANCE_CATEGORIES",
           "trace_findings", "records_lost", "WRITE_ERROR_EVENT"]

# Categories that say where the time goes (candidates for "bottleneck").
PERFORMANCE_CATEGORIES: tuple[str, ...] = (
    "data_pipeline", "communication", "straggler", "compute", "throughput_regression",
    "stall", "memory",
)
# Device idle above this share of a traced step: the device waits for the host.
_TRACE_IDLE_WARN_PCT = 30.0
# Exposed communication above 30% of the step (field report).
_TRACE_COMM_WARN_PCT = 30.0


@dataclass
class Diagnosis:
    bottleneck: str | None
    findings: list[Finding]
    advice: list[Advice] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Exactly the ``stepscope diagnose --json`` contract: bottleneck and findings."""
        return {"bottleneck": self.bottleneck,
                "findings": [f.to_dict() for f in self.findings]}

    def to_stored(self) -> dict[str, Any]:
        """Everything, advice included (``from_stored`` reads it back)."""
        return {**self.to_dict(), "advice": [a.to_dict() for a in self.advice]}

    @classmethod
    def from_stored(cls, d: Mapping[str, Any]) -> Diagnosis:
        return cls(d["bottleneck"], [Finding.from_dict(f) for f in d["findings"]],
                   [Advice(**a) for a in d["advice"]])

    def top(self, n: int = 5, min_severity: str = "info") -> list[Finding]:
        limit = severity_rank(min_severity)
        return [f for f in self.findings if severity_rank(f.severity) <= limit][:n]


def _impact(f: Finding) -> float:
    v = f.evidence.get("impact_frac")
    return float(v) if isinstance(v, (int, float)) and np.isfinite(v) else 0.0


def _gather_stragglers(ev: Mapping[str, Any], cfg: HealthConfig) -> list[int]:
    """The stragglers of one ``cross_rank`` event, judged by ``cfg``'s threshold from the
    recorded scores (so runs recorded with another threshold read alike); the recorded
    list when an event has no scores."""
    scores = ev.get("straggler_scores")
    if isinstance(scores, Mapping) and scores:
        try:
            return cfg.stragglers({int(r): float(s) for r, s in scores.items()})
        except (TypeError, ValueError):
            pass
    return [r for r in ev.get("stragglers") or []
            if isinstance(r, int) and not isinstance(r, bool)]


def _event_findings(events: Sequence[Mapping[str, Any]], n_ranks: int,
                    cfg: HealthConfig) -> list[Finding]:
    """Findings recorded as events. Cross-rank straggler flags are used only when the step
    table holds fewer than two ranks: with every rank's records, the health rule (which
    separates communication wait from work) is authoritative."""
    out: list[Finding] = []
    stragglers: dict[int, int] = {}
    gathers = 0
    for ev in events:
        kind = ev.get("type")
        if kind == ISOLATION_EVENT and isinstance(ev.get("result"), Mapping):
            out.append(isolation_finding(IsolationResult.from_dict(ev["result"])))
        elif kind == "finding" and ev.get("category") in CATEGORIES:
            try:
                steps = ev.get("steps")
                out.append(Finding(
                    category=ev["category"], severity=ev.get("severity", "info"),
                    message=str(ev.get("message", "")), evidence=dict(ev.get("evidence", {})),
                    steps=(int(steps[0]), int(steps[-1])) if steps else None,
                    rank=ev.get("rank"), recommendation=str(ev.get("recommendation", "")),
                    confidence=float(ev.get("confidence", 1.0)), rule=str(ev.get("rule", ""))))
            except (ValueError, TypeError):
                continue
        elif kind == "cross_rank" and isinstance(ev.get("stragglers") or [], list):
            gathers += 1
            for r in _gather_stragglers(ev, cfg):
                stragglers[r] = stragglers.get(r, 0) + 1
    for r, n in stragglers.items():
        if n_ranks < 2 and gathers >= 2 and n >= gathers / 2:
            out.append(Finding(
                category="straggler", severity="warning",
                message=f"rank {r} was flagged as a straggler in {n} of {gathers} cross-rank "
                        "gathers during the run",
                evidence={"gathers": gathers, "flagged": n}, rank=r, confidence=0.7,
                rule="events.cross_rank",
                recommendation=f"Compare rank {r}'s profile with another rank's"))
    return out


WRITE_ERROR_EVENT = "write_error"


def records_lost(meta: RunMeta | None, events: Sequence[Mapping[str, Any]]
                 ) -> tuple[int, str | None]:
    """(step records lost to write errors, the first error) over all ranks.

    Each rank that dropped records appends a ``write_error`` event (cumulative count, so
    the latest per rank counts); rank 0 also writes its count into run.json
    (``config.records_dropped``), which survives a disk too full for events.jsonl.
    """
    per_rank: dict[int, int] = {}
    first: str | None = None
    for ev in events:
        n, r = _count(ev.get("records_dropped")), _count(ev.get("rank"))
        if ev.get("type") != WRITE_ERROR_EVENT or n is None or r is None:
            continue
        per_rank[r] = max(per_rank.get(r, 0), n)
        first = first or (str(ev["first_error"]) if ev.get("first_error") else None)
    config = meta.config if meta is not None else {}
    n0 = _count(config.get("records_dropped"))
    if n0 is not None:
        per_rank[0] = max(per_rank.get(0, 0), n0)
    if first is None and isinstance(config.get("degraded"), str):
        first = config["degraded"]
    return sum(per_rank.values()), first


def _count(v: Any) -> int | None:
    """``v`` if it is a count (a non-negative int, not a bool), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _loss_finding(meta: RunMeta | None, events: Sequence[Mapping[str, Any]]
                  ) -> Finding | None:
    lost, first = records_lost(meta, events)
    if not lost:
        return None
    return Finding(
        category="logging", severity="warning",
        message=(f"{lost} records lost to a write error"
                 + (f" ({first})" if first else "")
                 + "; the figures cover only the recorded steps, and missing steps are "
                   "not a stall"),
        evidence={"records_lost": lost, "first_error": first}, confidence=1.0,
        rule="store.write_error",
        recommendation="Free space on (or give write access to) the run directory's disk, "
                       "or pass --out on another disk")


def _trace_pcts(row: Mapping[str, Any]) -> tuple[float | None, float | None]:
    """(device idle %, exposed communication %) of one rank of a trace report; idle only
    for the accelerator view (a host-only trace is "idle" whenever Python is not in an op)."""
    idle = row.get("idle_pct") if row.get("view") == "accelerator" else None
    window, comm = row.get("window_us"), row.get("comm_us")
    exposed = None
    if isinstance(window, (int, float)) and window > 0 and isinstance(comm, (int, float)):
        exposed = 100.0 * (comm - float(row.get("comm_overlap_us") or 0.0)) / window
    return (float(idle) if isinstance(idle, (int, float)) else None), exposed


def trace_findings(report: Mapping[str, Any], config: HealthConfig | None = None
                   ) -> list[Finding]:
    """Findings from a trace breakdown (``TraceReport.to_dict()``, the ``stepscope trace
    --json`` shape): device idle, exposed communication, a straggler (its working-time
    score below ``config.straggler_score``)."""
    out: list[Finding] = []
    for key, row in (report.get("ranks") or {}).items():
        if not isinstance(row, Mapping):
            continue
        idle, exposed = _trace_pcts(row)
        if idle is not None and idle >= _TRACE_IDLE_WARN_PCT:
            out.append(Finding(
                category="compute", severity="warning",
                message=f"trace: the device is idle {idle:.0f}% of the traced window on rank "
                        f"{key}: it waits for the host (data, launches, synchronisation)",
                evidence={"idle_pct": idle, "impact_frac": idle / 100},
                rank=int(key), confidence=0.8, rule="trace.idle",
                recommendation="Look at the host timeline of the trace for data loading or "
                               "synchronising calls (.item(), prints) between kernels"))
        if exposed is not None and exposed >= _TRACE_COMM_WARN_PCT:
            out.append(Finding(
                category="communication", severity="warning",
                message=f"trace: exposed communication {exposed:.0f}% of the traced window on "
                        f"rank {key} (overlap {row.get('comm_comp_overlap_pct')}%)",
                evidence={"exposed_comm_pct": exposed, "impact_frac": exposed / 100},
                rank=int(key), confidence=0.9, rule="trace.comm",
                recommendation="Overlap gradient communication with backward (bucket "
                               "size, separate stream) or shard it (reduce-scatter)"))
    cmp_ = report.get("comparison")
    score = cmp_.get("straggler_score") if isinstance(cmp_, Mapping) else None
    if (isinstance(cmp_, Mapping) and isinstance(score, (int, float))
            and score < (config or HealthConfig()).straggler_score):
        r = int(cmp_["straggler_rank"])
        out.append(Finding(
            category="straggler", severity="warning",
            message=f"trace: rank {r} works longest (straggler score {score:.2f}); the "
                    f"slowest rank is {cmp_.get('slower_by_pct'):.0f}% slower, differing in "
                    f"{cmp_.get('differing_phase')}",
            evidence={k: cmp_.get(k) for k in ("straggler_score", "slower_by_pct",
                                               "differing_phase", "phase_delta_us")},
            rank=r, confidence=0.7, rule="trace.ranks",
            recommendation=f"Compare rank {r}'s {cmp_.get('differing_phase')} with another "
                           "rank's in the trace"))
    return out + op_findings(report)


def _demote(f: Finding, why: str) -> None:
    f.severity = "info"
    f.evidence["explained_by"] = why


def _reconcile(findings: list[Finding], table: StepTable) -> None:
    by = {c: [f for f in findings if f.category == c] for c in CATEGORIES}
    if table.has_data("loss"):  # metrics do reach stepscope: what is missing is optional
        for f in by["logging"]:
            if f.rule.startswith("integration") and f.severity == "warning":
                _demote(f, "the loss is recorded; only an optional measurement is missing")
    strag = [f for f in by["straggler"] if f.severity != "info"]
    for f in by["communication"] if strag else []:
        # the others' communication time is mostly waiting when the straggler's excess
        # accounts for at least half of it
        if (f.rule == "health.comm" and f.severity == "warning"
                and _impact(strag[0]) >= 0.5 * _impact(f)):
            _demote(f, f"communication time is mostly waiting for straggler rank "
                       f"{strag[0].rank}")
    nan = [f for f in by["numerics"] if f.severity == "critical" and f.steps]
    if nan:
        first = min(f.steps[0] for f in nan if f.steps)
        for f in by["loss_spike"] + by["grad_norm"] + by["convergence"]:
            if f.steps and f.steps[-1] >= first - 1:
                _demote(f, f"non-finite values from step {first}")
    spike_steps = {s for f in by["loss_spike"] if f.steps
                   for s in range(f.steps[0] - 1, f.steps[1] + 2)}
    for f in by["grad_norm"]:
        jumps = f.evidence.get("jump_steps") or []
        if jumps and f.severity == "warning" and all(s in spike_steps for s in jumps):
            _demote(f, "gradient jumps at the loss-spike steps")
    _reconcile_isolation(by["data_pipeline"], "data", "health.data_wait")
    _reconcile_isolation(by["communication"], "comm", "health.comm")


def _reconcile_isolation(found: list[Finding], kind: str, rule: str) -> None:
    """A suspicion the isolation experiment already settled: proved -> it is the evidence
    (no need to ask for the experiment again); refuted -> demoted."""
    iso = [f for f in found if f.rule == f"isolation.{kind}"]
    if not iso:
        return
    result = iso[-1].evidence["isolation"]
    for f in found:
        if f.rule != rule or f.severity != "warning":
            continue
        if result["verdict"] == "not_bottleneck":
            _demote(f, f"the {kind} isolation experiment found no throughput gain")
        elif result["verdict"] in ("bottleneck", "minor"):
            f.evidence["proved_by"] = "isolation experiment"
            f.recommendation = (f"Proved by the isolation experiment ({result['share']:.0%} "
                                f"of the step). {iso[-1].recommendation}")


# Rules a profiler window disturbs: its steps are slow (stall, throughput) and its buffers
# raise the process's memory (memory).
_PROFILED_RULES = ("memory", "stall", "throughput")


def _health(table: StepTable, meta: RunMeta | None, config: HealthConfig | None,
            now_wall_s: float | None, window: tuple[int, int] | None) -> list[Finding]:
    """The health rules; with a profiler window, the memory, stall and throughput rules see
    the run without the profiled steps, and, where memory is a lifetime high-water mark
    (RSS), without any step from the window on (the profiler's buffers stay counted)."""
    if window is None or not len(table):
        return check_health(table, meta, config, now_wall_s=now_wall_s)
    out = check_health(table, meta, config, now_wall_s=now_wall_s, skip=_PROFILED_RULES)
    step = table["step"]
    outside = (step < window[0]) | (step >= window[1])
    others = tuple(k for k in RULES if k not in ("stall", "throughput"))
    out += check_health(table.select(outside), meta, config, now_wall_s=now_wall_s,
                        skip=others)
    src = str((meta.environment if meta else {}).get("mem_source", "")).lower()
    before = step < window[0] if ("lifetime" in src or "rss" in src) else outside
    out += check_health(table.select(before), meta, config, now_wall_s=now_wall_s,
                        skip=tuple(k for k in RULES if k != "memory"))
    return out


def _demote_environment(findings: list[Finding], regimes: Regimes) -> None:
    """A throughput drop inside a contended or throttled regime is the environment's."""
    env = regimes.environment()
    for f in findings:
        # an info finding too: the rule may have called it contention from preemptions
        # alone, and the regime's evidence is what explains it
        if f.category != "throughput_regression" or not f.steps:
            continue
        # two change-point methods place one change a few steps apart: a drop within a
        # regime's first tenth (at least MIN_REGIME_STEPS) before it belongs to it
        hit = next((r for r in env if r.first_step - max(MIN_REGIME_STEPS, r.steps // 10)
                    <= f.steps[0] <= r.last_step), None)
        if hit is not None:
            _demote(f, f"{hit.name} ran under {hit.cause}")


def _compute_info(table: StepTable, findings: list[Finding],
                  regimes: Regimes) -> Finding | None:
    """The compute-bound note, over the steady-state regime only: steps the environment
    slowed say nothing about the model."""
    if any(f.category in PERFORMANCE_CATEGORIES and f.severity != "info" for f in findings):
        return None
    mask = regimes.mask(table)
    if regimes.steady_regime is not None:
        r = regimes.steady_regime
        mask = mask & (table["step"] >= r.first_step) & (table["step"] <= r.last_step)
    t = table.select(mask) if mask.any() else table
    total = nansum(t["step_time_s"])
    cols = [c for c in ("forward_s", "backward_s", "forward_backward_s", "optimizer_s")
            if t.has_data(c)]
    if total <= 0 or not cols:
        return None
    frac = sum(nansum(t[c]) for c in cols) / total
    return Finding(
        category="compute", severity="info",
        message=f"compute-bound: {' + '.join(c[:-2] for c in cols)} take {frac:.0%} of the "
                "step; no data, communication or straggler problem found",
        evidence={"compute_frac": frac, "impact_frac": 0.0,
                  "steps": regimes.steady_regime.name if regimes.steady_regime else None},
        confidence=0.7,
        rule="diagnose.compute",
        recommendation="Next gains are in the model itself: kernel fusion, bf16, a larger "
                       "micro-batch; capture a profile and read its heaviest ops with "
                       "`stepscope trace DIR`")


def health_findings(table: StepTable, meta: RunMeta | None = None,
                    events: Sequence[Mapping[str, Any]] | None = None,
                    config: HealthConfig | None = None, *,
                    now_wall_s: float | None = None) -> list[Finding]:
    """The health rules' findings that ``diagnose`` starts from (a profiler window's steps
    left out where they would disturb a rule); ``report`` computes them in a forked child
    while it summarizes, and hands them to ``diagnose(health=...)``."""
    return _health(table, meta, config or HealthConfig(), now_wall_s,
                   profiler_steps(meta, events or []))


def diagnose(table: StepTable, meta: RunMeta | None = None,
             events: Sequence[Mapping[str, Any]] | None = None,
             trace_report: Mapping[str, Any] | None = None,
             config: HealthConfig | None = None, *,
             now_wall_s: float | None = None,
             conditions: Conditions | None = None,
             health: Sequence[Finding] | None = None) -> Diagnosis:
    """Ranked findings, the bottleneck (or None) and advice for one run.

    ``events``: records of ``RunDir.read_events()`` (isolation results, integration
    findings, cross-rank gathers). ``trace_report``: a trace breakdown in the
    ``stepscope trace --json`` shape. ``now_wall_s``: UNIX time, for a live run's stall.
    ``conditions``: ``RunDir.read_conditions()``, evidence for the ``environment`` findings.
    ``health``: ``health_findings`` of the same table, meta, events, config and time,
    computed already: not computed again (diagnose may amend them, as it does its own).
    """
    cfg = config or HealthConfig()
    findings = (list(health) if health is not None
                else health_findings(table, meta, events, cfg, now_wall_s=now_wall_s))
    findings += _event_findings(events or [], len(table.ranks()) if len(table) else 0, cfg)
    loss = _loss_finding(meta, events or [])
    if loss is not None:
        findings.append(loss)
    if trace_report:
        findings += trace_findings(trace_report, cfg)
    env, regimes = (environment_findings(table, conditions) if len(table)
                    else ([], Regimes([], None)))
    findings += env
    _reconcile(findings, table)
    _demote_environment(findings, regimes)
    info = _compute_info(table, findings, regimes)
    if info is not None:
        findings.append(info)
    # Training health before speed at equal severity: a speed-up of a diverging run is moot;
    # the environment (context for the numbers, not a fault of the job) comes last.
    findings.sort(key=lambda f: (severity_rank(f.severity),
                                 2 if f.category == "environment"
                                 else int(f.category in PERFORMANCE_CATEGORIES), -_impact(f),
                                 -f.confidence, f.steps[0] if f.steps else -1))
    perf = [f for f in findings
            if f.category in PERFORMANCE_CATEGORIES and f.severity != "info"]
    bottleneck = max(perf, key=_impact).category if perf else None
    return Diagnosis(bottleneck, findings, advise(findings, meta))
