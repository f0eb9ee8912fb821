"""Health rules on speed and resources: data wait, exposed communication, memory,
throughput regressions (stragglers and stalls: ``health_ranks``).
Pure functions ``rule(ctx) -> list[Finding]``.

All shares are computed over steady steps (warm-up excluded, see ``summary.steady_mask``)
as sum(phase) / sum(step_time_s), the convention of the health-check sheet.

Example::

    ctx = HealthContext(table, meta, HealthConfig(), steady_mask(table))
    rule_data_wait(ctx)[0].evidence["data_wait_frac"]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..._fastnp import nansum
from ...findings import Finding
from ...schema import AnyArray, StepTable
from .._groups import Groups
from .config import HealthConfig, HealthContext
from .screens import creep_suspects, throughput_suspects
from .stats import (
    best_split,
    quarter_medians,
    rank_series,
    spearman,
    split_medians_bound,
    theil_sen_slope,
)

__all__ = ["rule_data_wait", "rule_comm", "rule_memory", "rule_throughput", "memory_creep",
           "MemoryCreep"]

# Creep keeps going: each half of the series rises at >= a quarter of the whole series'
# rate (a steady leak: both halves at the full rate; one step up: both halves ~0). A
# quarter leaves room for a leak that slows (allocator caching, a cache filling up).
_CREEP_HALF_SLOPE = 0.25


PHASE_WORDS = {"other": "time outside the recorded phases (host work between them)",
                "data_wait": "data wait"}


def span_of(t: StepTable) -> tuple[int, int]:
    return int(t["step"].min()), int(t["step"].max())


def _share(t: StepTable, col: str) -> float:
    total = nansum(t["step_time_s"])
    return nansum(t[col]) / total if total > 0 else 0.0


def _worst_rank(t: StepTable, col: str) -> tuple[int | None, dict[str, float]]:
    # _share of each rank's rows from the rank groups (each nansum over the rank's rows in
    # table order, as over t.rank(r)) instead of one table copy per rank.
    g = Groups.of(t["rank"])
    totals, parts = g.sums(t["step_time_s"]).tolist(), g.sums(t[col]).tolist()
    per = {str(r): (part / total if total > 0 else 0.0)
           for r, total, part in zip(g.ranks.tolist(), totals, parts, strict=True)}
    if len(per) < 2:
        return None, per
    return int(max(per, key=lambda k: per[k])), per


def rule_data_wait(ctx: HealthContext) -> list[Finding]:
    """Share of step time blocked waiting for the next batch (> 5% -> warning)."""
    cfg = ctx.config
    t = ctx.table.select(ctx.steady)
    if not len(t) or not t.has_data("data_wait_s"):
        return []
    frac = _share(t, "data_wait_s")
    med_wait = float(np.nanmedian(t["data_wait_s"]))
    worst, per = _worst_rank(t, "data_wait_s")
    worst_frac = per[str(worst)] if worst is not None else frac
    mean_wait = float(np.nanmean(t["data_wait_s"]))
    # Typical wait above the floor, or rare long waits (shard loads, retries) whose mean is
    # 10x the floor; a few ms of scheduler noise on sub-ms waits is neither.
    long_enough = med_wait >= cfg.data_wait_min_s or mean_wait >= 10 * cfg.data_wait_min_s
    if worst_frac <= cfg.data_wait_warn_frac or not long_enough:
        return []
    uneven = worst is not None and worst_frac > 2 * max(min(per.values()), 1e-9)
    return [Finding(
        category="data_pipeline", severity="warning",
        message=(f"the devices wait for data {frac:.0%} of the step time "
                 f"(median {med_wait * 1e3:.1f} ms per step)"
                 + (f"; worst on rank {worst} ({worst_frac:.0%})" if uneven else "")),
        evidence={"data_wait_frac": frac, "median_data_wait_s": med_wait,
                  "mean_data_wait_s": mean_wait,
                  "median_step_time_s": float(np.nanmedian(t["step_time_s"])),
                  "per_rank_frac": per, "impact_frac": frac},
        steps=span_of(t), rank=worst if uneven else None, confidence=0.9,
        rule="health.data_wait",
        recommendation=("Prove it: `stepscope isolate data -- <your command>` replays cached "
                        "batches; then add loader workers, prefetch and a tokenization cache"),
    )]


def rule_comm(ctx: HealthContext) -> list[Finding]:
    """Exposed communication share (> 30%: compute and communication not overlapped)."""
    cfg = ctx.config
    t = ctx.table.select(ctx.steady)
    col = "comm_exposed_s" if t.has_data("comm_exposed_s") else "comm_s"
    if not len(t) or not t.has_data(col):
        return []
    frac = min(1.0, _share(t, col))
    if frac <= cfg.comm_info_frac:
        return []
    exact = col == "comm_exposed_s"
    worst, per = _worst_rank(t, col)
    sev = "warning" if frac > cfg.comm_warn_frac else "info"
    what = "exposed communication" if exact else "communication (overlap unknown: upper bound)"
    return [Finding(
        category="communication", severity=sev,
        message=f"{what} takes {frac:.0%} of the step time",
        evidence={"comm_frac": frac, "column": col, "overlap_measured": exact,
                  "per_rank_frac": per, "impact_frac": frac},
        steps=span_of(t), rank=None, confidence=0.9 if exact else 0.6, rule="health.comm",
        recommendation=("Measure the bound: `stepscope isolate comm -- <your command>`; then "
                        "overlap (bigger DDP buckets, no_sync with accumulation) or shard "
                        "(ZeRO/FSDP reduce-scatter)"),
    )]


@dataclass(frozen=True)
class MemoryCreep:
    """Evidence of memory creep over a series of steps (bytes; per step of the series)."""

    first_bytes: float  # median of the first quarter of the series
    last_bytes: float  # median of the last quarter
    bytes_per_step: float  # Theil-Sen slope over the whole series
    rank_correlation: float  # Spearman, peak against step
    first_step: int
    last_step: int


def memory_creep(steps: AnyArray, peak: AnyArray, cfg: HealthConfig) -> MemoryCreep | None:
    """Memory creep, the one definition (diagnose's rule and the live alert use it).

    Over ``steps`` (at least ``cfg.min_steps`` finite points) the peak grows from the first
    to the last quarter's median by ``mem_creep_frac`` and ``mem_creep_min_bytes``, rises
    steadily (Spearman rank correlation with the step >= ``mem_creep_min_corr``), and keeps
    rising: the Theil-Sen slopes of both halves are at least a quarter of the whole
    series' slope, so one allocation (a cache filled once, a step up at one point) is a
    level change, not creep, however large.
    """
    ok = np.isfinite(peak) & np.isfinite(steps)
    x, y = steps[ok].astype(float), peak[ok].astype(float)
    if x.size < cfg.min_steps:
        return None
    first, last = quarter_medians(y)
    growth = last - first
    if growth < cfg.mem_creep_min_bytes or growth < cfg.mem_creep_frac * first:
        return None
    corr = spearman(x, y)
    slope = theil_sen_slope(x, y)
    if corr < cfg.mem_creep_min_corr or not slope > 0:
        return None
    half = x.size // 2
    for part in (slice(0, half), slice(half, None)):
        if not theil_sen_slope(x[part], y[part]) >= _CREEP_HALF_SLOPE * slope:
            return None
    return MemoryCreep(first, last, slope, corr, int(x[0]), int(x[-1]))


def rule_memory(ctx: HealthContext) -> list[Finding]:
    """Memory creep (peak grows step over step) and the memory pattern (temp vs plateau)."""
    cfg = ctx.config
    t = ctx.table.select(ctx.steady)
    if not t.has_data("mem_peak_bytes"):
        return []
    out: list[Finding] = []
    for r in creep_suspects(t, cfg):  # the ranks whose quarter medians could show creep
        steps, peak = rank_series(t, r, "mem_peak_bytes")
        c = memory_creep(steps, peak, cfg)
        if c is not None:
            out.append(Finding(
                category="memory", severity="warning",
                message=(f"memory creep on rank {r}: peak grows from {c.first_bytes / 2**20:.0f} "
                         f"MiB to {c.last_bytes / 2**20:.0f} MiB (~{c.bytes_per_step / 2**20:.2f}"
                         " MiB per step)"),
                evidence={"first_quarter_bytes": c.first_bytes,
                          "last_quarter_bytes": c.last_bytes,
                          "bytes_per_step": c.bytes_per_step,
                          "rank_correlation": c.rank_correlation,
                          "mem_source": _mem_source(ctx) or None},
                steps=(c.first_step, c.last_step), rank=r, confidence=0.8,
                rule="health.memory",
                recommendation="Look for tensors kept across steps (losses appended with their "
                               "graph: use loss.item(); growing caches); compare two memory "
                               "snapshots a few hundred steps apart"))
            break
    out.extend(_memory_pattern(t, ctx))
    return out


def _mem_source(ctx: HealthContext) -> str:
    if ctx.meta is None:
        return ""
    return str(ctx.meta.environment.get("mem_source") or ctx.meta.config.get("mem_source") or "")


def _memory_pattern(t: StepTable, ctx: HealthContext) -> list[Finding]:
    # A lifetime high-water mark (process peak RSS) says nothing about the shape of one
    # step's memory: the pattern needs a per-step peak (e.g. CUDA max_memory_allocated
    # reset each step).
    src = _mem_source(ctx).lower()
    if not t.has_data("mem_alloc_bytes") or "lifetime" in src or "rss" in src:
        return []
    peak = float(np.nanmedian(t["mem_peak_bytes"]))
    held = float(np.nanmedian(t["mem_alloc_bytes"]))
    if held <= 0:
        return []
    ratio = peak / held
    if ratio >= ctx.config.mem_temp_ratio:
        msg = (f"memory peaks at {ratio:.1f}x what is held at step end: temporary buffers "
               "(activations, communication buffers) dominate the peak")
        rec = "Selective recompute of the most memory-hungry blocks, or a smaller micro-batch"
    elif ratio <= ctx.config.mem_plateau_ratio:
        msg = (f"memory stays on a high plateau ({ratio:.2f}x of end-of-step allocation): "
               "weights, gradients and optimizer states dominate")
        rec = "Shard optimizer states (ZeRO-1/2, FSDP) or use a lower-precision optimizer"
    else:
        return []
    return [Finding(category="memory", severity="info", message=msg,
                    evidence={"peak_bytes": peak, "end_of_step_bytes": held, "ratio": ratio},
                    steps=span_of(t), rank=None, confidence=0.6, rule="health.memory",
                    recommendation=rec)]


def rule_throughput(ctx: HealthContext) -> list[Finding]:
    """Throughput regressions (a changepoint) and progressive drift, per rank."""
    cfg = ctx.config
    t = ctx.table.select(ctx.steady)
    best: Finding | None = None
    for r in throughput_suspects(t, cfg):  # the ranks whose quarters or bounds could drop
        f = _rank_throughput(t, r, ctx)
        if f is not None and (best is None or f.evidence["drop_frac"] > best.evidence["drop_frac"]):
            best = f
    if best is not None and len(t.ranks()) > 1:
        best.rank = None if _all_ranks_slow(t, ctx) else best.rank
    return [best] if best is not None else []


def _rate(t: StepTable, r: int) -> tuple[AnyArray, AnyArray, str]:
    steps, st = rank_series(t, r, "step_time_s")
    _, tok = rank_series(t, r, "tokens")
    if np.isfinite(tok).all() and tok.size:
        with np.errstate(divide="ignore", invalid="ignore"):
            return steps, tok / st, "tokens/s"
    with np.errstate(divide="ignore"):
        return steps, 1.0 / st, "steps/s"


def _rank_throughput(t: StepTable, r: int, ctx: HealthContext) -> Finding | None:
    cfg = ctx.config
    steps, rate, unit = _rate(t, r)
    ok = np.isfinite(rate) & (rate > 0)
    steps, rate = steps[ok], rate[ok]
    if rate.size < cfg.regression_min_steps:
        return None
    seg = max(cfg.regression_min_segment, rate.size // 10)
    q0, q1 = quarter_medians(rate)
    lo, hi = split_medians_bound(rate, seg)
    # Neither a drift (its quarter medians) nor a step change (the widest split medians
    # possible) could reach the drop: the split and the trend are not worth computing (at
    # 1,024 ranks they were half of `diagnose`). Comparisons as below, so the same ranks
    # pass: a NaN bound (too short to split) leaves only the drift test.
    quarter_drop = 1 - q1 / q0 >= cfg.regression_drop
    if not quarter_drop and not 1 - lo / hi >= cfg.regression_drop:
        return None
    k = best_split(rate, seg)
    before = float(np.median(rate[:k])) if k else float("nan")
    after = float(np.median(rate[k:])) if k else float("nan")
    corr = -spearman(steps.astype(float), rate)
    drift = corr >= cfg.drift_min_corr and quarter_drop
    step_drop = k is not None and 1 - after / before >= cfg.regression_drop
    if not (drift or step_drop):
        return None
    if step_drop:  # a step change has flat segments; a drift keeps trending inside them
        assert k is not None
        inside = max(-spearman(steps[:k].astype(float), rate[:k]),
                     -spearman(steps[k:].astype(float), rate[k:]))
        drift = drift and inside >= cfg.drift_min_corr
    n = rate.size
    if drift:
        q = max(1, n // 4)
        a, b, drop = q0, q1, 1 - q1 / q0
        sel = (np.arange(n) < q, np.arange(n) >= n - q)
        msg = (f"throughput declines progressively: {_num(a)} -> {_num(b)} {unit} (-{drop:.0%}) "
               f"from step {int(steps[0])} to {int(steps[-1])}")
        span = (int(steps[0]), int(steps[-1]))
    else:
        assert k is not None
        a, b, drop = before, after, 1 - after / before
        sel = (np.arange(n) < k, np.arange(n) >= k)
        msg = (f"throughput dropped at step {int(steps[k])}: {_num(a)} -> {_num(b)} {unit} "
               f"(-{drop:.0%})")
        span = (int(steps[k]), int(steps[-1]))
    phase, uniform = _slowdown_by_phase(t, r, ok, sel)
    _, st = rank_series(t, r, "step_time_s")
    st = st[ok]
    # Share of later steps still as fast as before: CPU contention preempts some steps and
    # spares others; a code or data regression slows (nearly) every step.
    fast = float(np.mean(st[sel[1]] <= (1 + cfg.regression_fast_tol) * np.median(st[sel[0]])))
    intermittent = fast >= cfg.regression_intermittent_frac
    why = _waiting_or_contention(t, r, ok, sel, st)
    uniform = uniform or why == "contention"
    if why == "contention" and not intermittent:
        msg += ("; CPU time per step is unchanged while involuntary context switches rose: "
                "other processes took the CPU (contention), not the training code")
    elif uniform:
        msg += ("; every compute phase slowed alike: the host got slower (another process, "
                "throttling), not the training code")
    elif intermittent:
        msg += (f"; {fast:.0%} of the later steps still run at the earlier speed: intermittent "
                "(CPU contention from other processes, or occasional stalls)")
    elif phase:
        msg += f"; the extra time is in {PHASE_WORDS.get(phase, phase)}"
    if why == "waiting":
        msg += "; CPU time per step did not grow: the process is waiting, not computing"
    return Finding(
        category="throughput_regression",
        severity="info" if uniform or intermittent else "warning", message=msg,
        evidence={"before": a, "after": b, "unit": unit, "drop_frac": drop,
                  "trend_corr": corr, "progressive": bool(drift), "impact_frac": drop,
                  "slower_phase": phase, "uniform_slowdown": uniform, "cause_hint": why,
                  "still_fast_frac": fast},
        steps=span, rank=r, confidence=0.8, rule="health.throughput",
        recommendation=("Compare a profile from before and after the change point "
                        "(`stepscope trace diff`); look for growing data queues, memory "
                        "fragmentation, thermal throttling or another job on the node"),
    )


_SLOW_PHASES = ("data_wait_s", "forward_s", "backward_s", "optimizer_s", "comm_exposed_s")
_COMPUTE = ("forward_s", "backward_s", "optimizer_s")


def _slowdown_by_phase(t: StepTable, r: int, ok: AnyArray,
                       sel: tuple[AnyArray, AnyArray]) -> tuple[str | None, bool]:
    """(phase with the largest median increase, whether the slowdown is uniform).

    Uniform: every compute phase slowed by at least half the step's relative slowdown and
    compute accounts for >= 60% of the extra time -- what a busier or throttled host does
    to everything; a code or data regression grows one phase (stepscope's rule of thumb).
    """
    cols = {c: rank_series(t, r, c)[1][ok] for c in ("step_time_s", *_SLOW_PHASES)
            if t.has_data(c)}
    if not all(c in cols for c in _COMPUTE):
        return None, False
    step = cols.pop("step_time_s")
    cols["other_s"] = step - sum(np.nan_to_num(v) for v in cols.values())
    b, a = sel

    def med(v: AnyArray, m: AnyArray) -> float:
        x = v[m][np.isfinite(v[m])]
        return float(np.median(x)) if x.size else 0.0

    inc = {c: med(v, a) - med(v, b) for c, v in cols.items()}
    step_b, step_inc = med(step, b), med(step, a) - med(step, b)
    if step_b <= 0 or step_inc <= 0:
        return None, False
    slow = step_inc / step_b
    uniform = (all(med(cols[c], b) > 0 and inc[c] / med(cols[c], b) >= 0.5 * slow
                   for c in _COMPUTE)
               and sum(inc[c] for c in _COMPUTE) >= 0.6 * step_inc)
    phase = max(inc, key=lambda c: inc[c])
    return phase.removesuffix("_s"), bool(uniform)


def _waiting_or_contention(t: StepTable, r: int, ok: AnyArray, sel: tuple[AnyArray, AnyArray],
                           st: AnyArray) -> str | None:
    """Why wall time grew while CPU time did not (needs ``cpu_s``; ``preempt`` to tell).

    Wall time per step grew, CPU time (all threads) grew less than half as much: the
    process was not computing more. If its involuntary context switches per step at least
    doubled (and rose by >= 1), the kernel was taking the CPU away: "contention". Otherwise
    it was waiting (sleep, I/O, a lock, a queue): "waiting" -- a real regression to find.
    """
    if not t.has_data("cpu_s"):
        return None
    cpu = rank_series(t, r, "cpu_s")[1][ok]
    b, a = sel
    med = _finite_median
    cb, ca = med(cpu[b]), med(cpu[a])
    wb, wa = float(np.median(st[b])), float(np.median(st[a]))
    if not (np.isfinite(cb) and np.isfinite(ca)) or wa <= wb or ca - cb >= 0.5 * (wa - wb):
        return None
    if t.has_data("preempt"):
        pre = rank_series(t, r, "preempt")[1][ok]
        pb, pa = med(pre[b]), med(pre[a])
        if np.isfinite(pb) and np.isfinite(pa) and pa >= 2 * pb and pa - pb >= 1:
            return "contention"
    return "waiting"


def _num(x: float) -> str:
    """A rate for people: 28,749 (not 2.875e+04)."""
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"


def _finite_median(x: AnyArray) -> float:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else float("nan")


def _all_ranks_slow(t: StepTable, ctx: HealthContext) -> bool:
    return all(_rank_throughput(t, r, ctx) is not None for r in t.ranks())
