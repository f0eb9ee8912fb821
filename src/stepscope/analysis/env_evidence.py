"""The environment a run ran in, as evidence: condition differences between two runs,
environment findings of one run, and the steps a profiler window disturbed.

Two runs of one script on a shared host can differ by 5x for reasons that have nothing to
do with the code (field report: "+418% faster" between two identical demos, with a median
of 664 involuntary context switches per step in one and 107 in the other). So before any
speed verdict, :func:`condition_differences` compares what each run's own records say
about its host over its headline steps:

* CPU per wall-second and involuntary context switches per second, per step, from the step
  table (always recorded; the wall second is the time between the rank's step ends that
  ``cpu_s`` and ``preempt`` cover, ``regimes.usage_wall``);
* the training thread's on-CPU and run-queue shares (schedstat): less CPU *and* more
  queueing is contention; less CPU with less queueing is the code waiting, not the host;
* other processes' CPU use, hypervisor steal, CPU and GPU clocks, NVML slow-down reasons and
  other processes on the device, from the condition samples (``stepscope.record.conditions``).

A difference counts when it passes the regime thresholds of ``analysis.regimes`` (one
definition for "contended" and "throttled") and, for per-step series, exceeds 3 standard
errors of the two medians (the runs' own noise). Any counted difference makes a
comparison ``inconclusive``.

Example::

    diffs = condition_differences(table_a, cond_a, table_b, cond_b)
    [d.message for d in diffs]   # ["contention: 212 involuntary context switches/s in B ..."]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from ..findings import Finding
from ..schema import AnyArray, RunMeta, StepTable
from . import regimes as rg
from .summary import Conditions, headline_mask

__all__ = ["ConditionDiff", "condition_differences", "environment_findings",
           "profiler_steps", "cpu_share", "SE_Z"]

# A per-step median differs beyond noise when the gap exceeds 3 standard errors.
SE_Z = 3.0
# Other processes using at least half the host's CPUs through a whole run is a noisy
# neighbour worth naming even without a quieter stretch to compare with.
NOISY_CORES_FRAC = 0.5


@dataclass(frozen=True)
class ConditionDiff:
    """One condition that differs between runs A and B, with its numbers."""

    name: str
    a: float
    b: float
    kind: str  # "contention" | "throttling"
    message: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _per_step(table: StepTable, conditions: Conditions | None
              ) -> tuple[StepTable, AnyArray | None]:
    """The headline steps, and the wall seconds their usage columns cover
    (``regimes.usage_wall``) taken from the whole table: a headline step's predecessor
    need not be one."""
    mask, _ = headline_mask(table, conditions)
    if not (table.has_data("cpu_s") or table.has_data("preempt")):
        return (table.select(mask) if mask.any() else table), None  # nothing to rate
    wall = rg.usage_wall(table)
    return (table.select(mask), wall[mask]) if mask.any() else (table, wall)


def _rate(t: StepTable, col: str, wall: AnyArray | None = None) -> AnyArray:
    """``col`` per wall-second of what it covers, finite values only."""
    if not t.has_data(col):
        return np.array([])
    with np.errstate(divide="ignore", invalid="ignore"):
        v = np.asarray(t[col] / (rg.usage_wall(t) if wall is None else wall))
    return np.asarray(v[np.isfinite(v)])


def _median_se(x: AnyArray) -> float:
    # s.e. of a median: sqrt(pi/2) x sigma / sqrt(n), sigma = 1.4826 x MAD
    mad = float(np.median(np.abs(x - np.median(x))))
    return 1.2533 * 1.4826 * mad / math.sqrt(x.size)


def _beyond_noise(a: AnyArray, b: AnyArray) -> bool:
    if a.size < 3 or b.size < 3:
        return False
    gap = abs(float(np.median(a) - np.median(b)))
    return gap > SE_Z * math.hypot(_median_se(a), _median_se(b))


def _window(t: StepTable) -> tuple[float, float]:
    wall = t["wall_time_s"]
    ok = np.isfinite(wall)
    if not ok.any():
        return math.nan, math.nan
    return float(np.min(wall[ok] - t["step_time_s"][ok])), float(np.max(wall[ok]))


def _samples(conditions: Conditions | None, t: StepTable, key: str) -> AnyArray:
    if not conditions:  # before the window: it reads two columns of every headline row
        return np.array([])
    t0, t1 = _window(t)
    if not math.isfinite(t0):
        return np.array([])
    return rg.window_values(rg.condition_columns(conditions), key, t0, t1)


def cpu_share(cond: Conditions | None, t: StepTable, wall: AnyArray | None = None
              ) -> float | None:
    """The training thread's on-CPU share (schedstat), else CPU per wall-second (``wall``:
    the seconds each row's usage covers, when ``t`` is a selection of a larger table)."""
    v = _samples(cond, t, "main_oncpu_frac")
    if v.size:
        return float(np.median(v))
    c = _rate(t, "cpu_s", wall)
    return float(np.median(c)) if c.size else None


def _step_diffs(ta: StepTable, wa: AnyArray | None, tb: StepTable, wb: AnyArray | None
                ) -> list[ConditionDiff]:
    """Contention from the step table: one run was preempted more often per second AND got
    less CPU per wall-second (both beyond noise). More preemptions with as much CPU is a
    faster-stepping run, less CPU alone is the code waiting (a slow loader): neither is
    the host's doing."""
    ca, cb = _rate(ta, "cpu_s", wa), _rate(tb, "cpu_s", wb)
    pa, pb = _rate(ta, "preempt", wa), _rate(tb, "preempt", wb)
    if not (ca.size and cb.size and pa.size and pb.size):
        return []
    if not (_beyond_noise(pa, pb) and _beyond_noise(ca, cb)):
        return []
    p = float(np.median(pa)), float(np.median(pb))
    c = float(np.median(ca)), float(np.median(cb))
    worse = 1 if p[1] > p[0] else 0  # the run preempted more often
    other = 1 - worse
    if not (p[worse] >= rg.PREEMPT_RATIO * p[other]
            and p[worse] - p[other] >= rg.PREEMPT_MIN_DELTA_PER_S
            and c[worse] < (1 - rg.CPU_SHARE_DROP / 2) * c[other]):
        return []
    run = "AB"[worse]
    return [
        ConditionDiff("preempt_per_s", p[0], p[1], "contention",
                      f"contention: {p[worse]:,.0f} involuntary context switches per second "
                      f"in run {run} against {p[other]:,.0f}"),
        ConditionDiff("cpu_per_wall", c[0], c[1], "contention",
                      f"contention: run {run} got {c[worse]:.2f} CPU-seconds per "
                      f"wall-second against {c[other]:.2f}: other processes took its CPU"),
    ]


def _sample_diffs(ta: StepTable, wa: AnyArray | None, cond_a: Conditions | None,
                  tb: StepTable, wb: AnyArray | None,
                  cond_b: Conditions | None) -> list[ConditionDiff]:
    out: list[ConditionDiff] = []

    def med(cond: Conditions | None, t: StepTable, key: str) -> float | None:
        v = _samples(cond, t, key)
        return float(np.median(v)) if v.size else None

    on = med(cond_a, ta, "main_oncpu_frac"), med(cond_b, tb, "main_oncpu_frac")
    rq = med(cond_a, ta, "main_runq_frac"), med(cond_b, tb, "main_runq_frac")
    if None not in on and None not in rq:
        oa, ob, qa, qb = (float(x) for x in (*on, *rq))  # type: ignore[arg-type]
        k = 1 if ob < oa else 0
        o, q = (oa, ob), (qa, qb)
        if o[k] < (1 - rg.CPU_SHARE_DROP) * o[1 - k] and q[k] - q[1 - k] >= rg.RUNQ_DELTA:
            out.append(ConditionDiff(
                "main_runq_frac", qa, qb, "contention",
                f"contention: the training thread of run {'AB'[k]} ran {o[k]:.0%} of the "
                f"wall time against {o[1 - k]:.0%} and queued for a CPU {q[k]:.0%} of it "
                f"against {q[1 - k]:.0%}"))
    share = (cpu_share(cond_a, ta, wa), cpu_share(cond_b, tb, wb))

    checks = (
        ("others_cpu_cores", "contention", rg.OTHERS_CORES_DELTA,
         "other processes used {hi:.1f} CPU cores beside run {w} against {lo:.1f}"),
        ("host_steal_frac", "contention", rg.STEAL_DELTA,
         "hypervisor steal {hi:.0%} of CPU time in run {w} against {lo:.0%}"),
        ("gpu_other_procs", "contention", 1.0,
         "{hi:.0f} other processes on the device in run {w} against {lo:.0f}"),
    )
    for key, kind, delta, text in checks:
        a, b = med(cond_a, ta, key), med(cond_b, tb, key)
        if a is not None and b is not None and abs(a - b) >= delta:
            w = "B" if b > a else "A"
            s_busy, s_calm = (share[1], share[0]) if w == "B" else share
            if key != "gpu_other_procs" and not (
                    s_busy is not None and s_calm is not None
                    and s_busy < (1 - rg.CPU_SHARE_DROP / 2) * s_calm):
                continue  # neighbours that did not take this run's CPU did not slow it
            out.append(ConditionDiff(key, a, b, kind, f"{kind}: " + text.format(
                hi=max(a, b), lo=min(a, b), w=w)))
    for key, what in (("cpu_mhz", "CPU clock"), ("gpu_sm_clock_mhz", "GPU SM clock")):
        a, b = med(cond_a, ta, key), med(cond_b, tb, key)
        if a and b and min(a, b) < rg.CLOCK_RATIO * max(a, b):
            w = "B" if b < a else "A"
            out.append(ConditionDiff(key, a, b, "throttling",
                                     f"throttling: {what} {min(a, b):,.0f} MHz in run {w} "
                                     f"against {max(a, b):,.0f} MHz"))
    return out


def condition_differences(table_a: StepTable, cond_a: Conditions | None,
                          table_b: StepTable, cond_b: Conditions | None
                          ) -> list[ConditionDiff]:
    """Conditions that differ between the two runs' headline steps beyond their noise."""
    (ta, wa), (tb, wb) = _per_step(table_a, cond_a), _per_step(table_b, cond_b)
    if not len(ta) or not len(tb):
        return []
    return _step_diffs(ta, wa, tb, wb) + _sample_diffs(ta, wa, cond_a, tb, wb, cond_b)


def _regime_finding(r: rg.Regime, total: int) -> Finding:
    share = r.steps / total if total else 0.0
    return Finding(
        category="environment", severity="warning",
        message=f"{r.name} ran under {r.cause}: {r.evidence}",
        evidence={"regime": r.to_dict(), "cause": r.cause, "steps_frac": share,
                  "impact_frac": 0.0},
        steps=(r.first_step, r.last_step), confidence=0.8, rule="environment.regime",
        recommendation=("The numbers of these steps describe the host, not the training "
                        "code: rerun on a quiet host (or compare with `--repeat` runs); the "
                        "headline numbers use the steady-state regime"))


def environment_findings(table: StepTable, conditions: Conditions | None = None
                         ) -> tuple[list[Finding], rg.Regimes]:
    """Findings of category ``environment`` (contended or throttled regimes, a noisy
    neighbour through the whole run), and the regimes they came from."""
    mask, regimes = headline_mask(table, conditions)
    total = sum(r.steps for r in regimes.regimes)
    out = [_regime_finding(r, total) for r in regimes.environment()]
    steady = table.select(mask) if mask.any() else table
    others = _samples(conditions, steady, "others_cpu_cores")
    ncpu = _samples(conditions, steady, "ncpu")
    if others.size and ncpu.size and np.median(others) >= NOISY_CORES_FRAC * np.median(ncpu):
        out.append(Finding(
            category="environment", severity="info",
            message=(f"noisy neighbours: other processes used a median "
                     f"{float(np.median(others)):.1f} of {float(np.median(ncpu)):.0f} CPU "
                     "cores while the steady steps ran; their speed depends on that load"),
            evidence={"others_cpu_cores": float(np.median(others)),
                      "ncpu": float(np.median(ncpu)), "impact_frac": 0.0},
            confidence=0.7, rule="environment.neighbours",
            recommendation="Measure on a quiet host, or compare runs interleaved or with "
                           "`stepscope compare --repeat`"))
    throttle = _samples(conditions, steady, "gpu_throttle_reasons")
    if throttle.size and np.any(throttle > 0):
        out.append(Finding(
            category="environment", severity="warning",
            message=(f"the GPU slowed its clocks in {float(np.mean(throttle > 0)):.0%} of the "
                     f"condition samples (NVML reasons 0x{int(np.max(throttle)):x})"),
            evidence={"throttled_frac": float(np.mean(throttle > 0)), "impact_frac": 0.0},
            confidence=0.8, rule="environment.throttle",
            recommendation="Check cooling and power limits (nvidia-smi -q -d PERFORMANCE)"))
    return out, regimes


def _half_open(spec: Any) -> tuple[int, int] | None:
    """``"a:b"`` (half-open, as ``--profile-steps``) or ``[a, b]`` (inclusive) -> [a, b)."""
    try:
        if isinstance(spec, str):
            a, _, b = spec.strip().partition(":")
            start = int(a)
            return start, int(b) if b else start + 1
        if isinstance(spec, Sequence) and len(spec) == 2:
            return int(spec[0]), int(spec[1]) + 1
    except (TypeError, ValueError):
        return None
    return None


def profiler_steps(meta: RunMeta | None, events: Sequence[Mapping[str, Any]] = ()
                   ) -> tuple[int, int] | None:
    """[first, stop) of the steps a profiler captured (``--profile-steps`` in run.json, or
    a ``profile`` event's steps), or None when the run was not profiled."""
    windows = []
    if meta is not None:
        w = _half_open(meta.config.get("profile_steps"))
        if w:
            windows.append(w)
    for ev in events:
        if ev.get("type") == "profile":
            w = _half_open(ev.get("steps"))
            if w:
                windows.append(w)
    if not windows:
        return None
    return min(w[0] for w in windows), max(w[1] for w in windows)
