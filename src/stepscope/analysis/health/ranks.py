"""Health rules across ranks and time: stragglers (a rank slower at its own work) and
stalls (no step for k x the median step; live when ``now_wall_s`` is given).
Pure functions ``rule(ctx) -> list[Finding]``.

Example::

    ctx = HealthContext(table, meta, HealthConfig(), steady_mask(table), now_wall_s=now)
    rule_stall(ctx)
"""

from __future__ import annotations

import warnings

import numpy as np

from ..._fastnp import unique_ints
from ...findings import Finding
from ...schema import BETWEEN_STEP_COLUMNS, AnyArray, StepTable
from .._groups import Groups
from ..regimes import host_took_cpu
from .config import HealthContext, straggler_scores
from .stats import by_rank, rank_series
from .system import PHASE_WORDS, span_of

__all__ = ["rule_straggler", "rule_stall", "own_time"]


def own_time(t: StepTable) -> tuple[AnyArray, str]:
    """Per-row time a rank spends on its own work: step time minus communication wait.

    In synchronous data parallelism every rank's step time is the same; the fast ranks
    spend the difference waiting in the collective, so the straggler is the rank with the
    most time outside communication. Falls back to data wait + forward when no
    communication time is recorded (DDP's backward includes the collective wait).
    """
    st = t["step_time_s"]
    for col in ("comm_s", "comm_exposed_s"):
        if t.has_data(col):
            return st - np.nan_to_num(t[col]), f"step_time_s - {col}"
    if t.has_data("forward_s"):
        return np.nan_to_num(t["data_wait_s"]) + t["forward_s"], "data_wait_s + forward_s"
    return np.full(len(t), np.nan), "not measurable"


def _median(x: AnyArray) -> float:
    """Median of the finite values; NaN (without numpy's all-NaN warning) when none."""
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else float("nan")


def rule_straggler(ctx: HealthContext) -> list[Finding]:
    """A rank consistently slower at its own work than the others (its
    :func:`~.config.straggler_scores` score below ``straggler_score``)."""
    cfg = ctx.config
    t = ctx.table.select(ctx.steady)
    ranks = t.ranks()
    if len(ranks) < 2:
        return []
    own, how = own_time(t)
    g = Groups.of(t["rank"], within=t["step"])  # each rank's finite median, one pass
    med = dict(zip(g.ranks.tolist(), g.medians(own).tolist(), strict=True))
    if not all(np.isfinite(v) and v > 0 for v in med.values()):
        return []
    scores = straggler_scores(med)
    slow = min(scores, key=lambda r: scores[r])
    score = scores[slow]
    ref = score * med[slow]
    excess = med[slow] - ref
    step_med = float(np.nanmedian(t["step_time_s"]))
    consistent = _slow_share(t, own, slow)
    if (score >= cfg.straggler_score or excess < cfg.straggler_min_excess_s
            or excess < cfg.straggler_min_excess_frac * step_med
            or consistent < cfg.straggler_consistency):
        return []
    phase = _phase_gap(t, slow)
    return [Finding(
        category="straggler", severity="warning",
        message=(f"rank {slow} is a straggler: its own work takes {med[slow] * 1e3:.1f} ms vs "
                 f"{ref * 1e3:.1f} ms on the others (score {score:.2f}); the other ranks wait "
                 f"for it" + (f"; the difference is in {PHASE_WORDS.get(phase, phase)}"
                               if phase else "")),
        evidence={"score": score, "rank_median_s": med[slow], "reference_median_s": ref,
                  "per_rank_median_s": {str(r): v for r, v in med.items()},
                  "slow_on_step_frac": consistent, "measured_as": how, "phase": phase,
                  "impact_frac": excess / step_med if step_med > 0 else None},
        steps=span_of(t), rank=slow, confidence=0.8, rule="health.straggler",
        recommendation=(f"Look at rank {slow}'s host (other processes, thermal throttling, "
                        "slower device or link, uneven data shard); compare its profile with "
                        "another rank's"),
    )]


def _slow_share(t: StepTable, own: AnyArray, rank: int) -> float:
    """Share of steps on which ``rank``'s own time is above the other ranks' median."""
    steps_u, si = unique_ints(t["step"], return_inverse=True)
    ranks_u, ri = unique_ints(t["rank"], return_inverse=True)
    grid = np.full((steps_u.size, ranks_u.size), np.nan)
    grid[si, ri] = own  # steps x ranks
    j = int(np.flatnonzero(ranks_u == rank)[0])
    others = np.delete(grid, j, axis=1)
    if bool(np.isfinite(others).all()):  # the same medians; nanmedian loops per row
        ref = np.median(others, axis=1)
    else:
        with warnings.catch_warnings():  # steps no other rank recorded: all-NaN rows
            warnings.simplefilter("ignore", RuntimeWarning)
            ref = np.nanmedian(others, axis=1)
    ok = np.isfinite(grid[:, j]) & np.isfinite(ref)
    return float(np.mean(grid[ok, j] > ref[ok])) if ok.any() else 0.0


def _phase_gap(t: StepTable, rank: int) -> str | None:
    """The phase in which ``rank`` spends the most extra time vs the other ranks; "other"
    is step time not attributed to any phase (e.g. host work outside the model)."""
    cols = [c for c in ("data_wait_s", "forward_s", "backward_s", "optimizer_s",
                        "comm_exposed_s") if t.has_data(c)]
    if not cols:
        return None
    per = {c: t[c] for c in cols}
    per["other_s"] = t["step_time_s"] - sum(np.nan_to_num(t[c]) for c in cols)
    gaps = {}
    for col, v in per.items():
        if col == "comm_exposed_s":
            continue  # the fast ranks' waiting, not the straggler's work
        gaps[col] = _median(v[t["rank"] == rank]) - _median(v[t["rank"] != rank])
    col = max(gaps, key=lambda c: gaps[c])
    return col.removesuffix("_s") if gaps[col] > 0 else None


def rule_stall(ctx: HealthContext) -> list[Finding]:
    """No step finished for k x the median step time (historical gaps, and 'now' if live)."""
    cfg = ctx.config
    t = ctx.table
    out: list[Finding] = []
    worst: tuple[float, int, int, int, float, float, str | None, str] | None = None
    for r in _stall_suspects(t, cfg.stall_factor, cfg.stall_min_s):
        steps, end = rank_series(t, r, "end_s")
        _, st = rank_series(t, r, "step_time_s")
        _, tool = rank_series(t, r, "tool_s")
        for col in BETWEEN_STEP_COLUMNS:  # evaluation, checkpoint saves: not a stall
            tool = np.nan_to_num(tool, nan=0.0) + np.nan_to_num(rank_series(t, r, col)[1])
        if not np.isfinite(end).any():
            steps, end = rank_series(t, r, "wall_time_s")
        ok = np.isfinite(end)
        if ok.sum() < 3:
            continue
        cpu, pre = (rank_series(t, r, c)[1][ok] for c in ("cpu_s", "preempt"))
        steps, end, tool = steps[ok], end[ok], tool[ok]
        med = float(np.nanmedian(st)) if np.isfinite(st).any() else float(np.median(np.diff(end)))
        limit = max(cfg.stall_factor * med, cfg.stall_min_s)
        # stepscope's own time before a step (profiler start/stop, gathers) is not a stall
        gap = np.diff(end) - np.nan_to_num(tool[1:], nan=0.0)
        # Records missing between two steps (lost to a write error) are no evidence of a
        # stall: only consecutive steps are judged.
        gap[np.diff(steps) != 1] = 0.0
        i = int(np.argmax(gap))
        if gap[i] >= limit and (worst is None or gap[i] > worst[0]):
            host, seen = _gap_accounting(np.diff(end), cpu[1:], pre[1:], i)
            worst = (float(gap[i]), r, int(steps[i]), int(steps[i + 1]), med,
                     float(end[-1] - end[0]), host, seen)
    if worst is not None:
        gap_s, r, a, b, med, run_s, host, seen = worst
        where = (f"{gap_s:.1f} s between steps {a} and {b} ({gap_s / med:.0f}x the median "
                 f"step of {med * 1e3:.1f} ms)")
        evidence = {"gap_s": gap_s, "median_step_time_s": med, "factor": gap_s / med,
                    "impact_frac": gap_s / run_s if run_s > 0 else None, "accounting": seen}
        if host is not None:  # the CPU was taken away: the host's doing, not the job's
            out.append(Finding(
                category="environment", severity="info",
                message=(f"the host took the CPU for {where}: {host}"),
                evidence={**evidence, "cause": "contention"}, steps=(a, b),
                rank=r if len(t.ranks()) == 1 else None, confidence=0.8,
                rule="health.stall",
                recommendation=("Run on a quiet host (or pin the job's cores) before judging "
                                "this gap; if it recurs there, treat it as a stall"),
            ))
        else:
            out.append(Finding(
                category="stall", severity="warning",
                message=f"training stalled: no step finished for {where}",
                evidence=evidence, steps=(a, b), rank=r if len(t.ranks()) == 1 else None,
                confidence=0.9, rule="health.stall",
                recommendation=("Find what ran in the gap (checkpoint save, evaluation, data "
                                "retries, a hung collective): add a py-spy dump or a timeout "
                                "alert on step time"),
            ))
    out.extend(_live_stall(ctx))
    return out


def _stall_suspects(t: StepTable, factor: float, min_s: float) -> list[int]:
    """The ranks :func:`rule_stall`'s check could flag, found for all ranks at once: the
    same gaps (the same float operations on the same rows), each rank's largest against
    its limit, from the median of its finite step times. A rank whose limit this cannot
    match (an infinite step time, none finite) is kept; the check itself then judges only
    these ranks, so its result is the same as over every rank, without a loop over 1,024
    ranks that find nothing."""
    ranks, bounds, (step, end, wall, st, tool, *between) = by_rank(
        t, "step", "end_s", "wall_time_s", "step_time_s", "tool_s", *BETWEEN_STEP_COLUMNS)
    if not ranks.size:
        return []
    gid = np.repeat(np.arange(ranks.size), np.diff(bounds))
    has_end = np.logical_or.reduceat(np.isfinite(end), bounds[:-1])
    if not has_end.all():
        end = np.where(has_end[gid], end, wall)
    for col in between:
        tool = np.nan_to_num(tool, nan=0.0) + np.nan_to_num(col)
    ok = np.isfinite(end)
    step, end, tool, g = step[ok], end[ok], tool[ok], gid[ok]
    gap = np.diff(end) - np.nan_to_num(tool[1:], nan=0.0)
    gap[np.diff(step) != 1] = 0.0
    inside = g[1:] == g[:-1]
    largest = np.full(ranks.size, -np.inf)
    np.maximum.at(largest, g[1:][inside], gap[inside])
    med = Groups.of(t["rank"], within=t["step"]).medians(t["step_time_s"])
    odd = np.logical_or.reduceat(np.isinf(st), bounds[:-1]) | np.isnan(med)
    with np.errstate(invalid="ignore"):  # a hair below the limit: never one ulp short
        could = (largest >= np.maximum(factor * med, min_s) * (1 - 1e-9)) | odd
    could &= np.bincount(g, minlength=ranks.size) >= 3
    return [int(r) for r in ranks[could]]


def _gap_accounting(span: AnyArray, cpu: AnyArray, pre: AnyArray, i: int
                    ) -> tuple[str | None, str]:
    """What the process's CPU accounting says of gap ``i`` (``span[i]`` seconds of wall
    time; ``cpu``/``pre``: CPU seconds and involuntary switches over each span): whether
    the host took the CPU (regimes' contention thresholds, against the other spans'
    medians), and the numbers in words."""
    with np.errstate(divide="ignore", invalid="ignore"):
        cpu_w, pre_s = cpu / span, pre / span
    if not (np.isfinite(cpu_w[i]) and np.isfinite(pre_s[i])):
        return None, "no CPU accounting recorded"
    rest = np.ones(span.size, dtype=bool)
    rest[i] = False
    seen = (f"{cpu[i]:.2f} CPU-s in {span[i]:.2f} s of wall time, {pre[i]:.0f} involuntary "
            "context switches")
    if not (np.isfinite(cpu_w[rest]).any() and np.isfinite(pre_s[rest]).any()):
        return None, seen
    host = host_took_cpu(float(cpu_w[i]), float(pre_s[i]), float(np.nanmedian(cpu_w[rest])),
                         float(np.nanmedian(pre_s[rest])))
    return host, seen


def _live_stall(ctx: HealthContext) -> list[Finding]:
    t = ctx.table
    if ctx.now_wall_s is None or not t.has_data("wall_time_s"):
        return []
    if ctx.meta is not None and ctx.meta.status != "running":
        return []
    last = float(np.nanmax(t["wall_time_s"]))
    med = float(np.nanmedian(t["step_time_s"])) if t.has_data("step_time_s") else 0.0
    idle = ctx.now_wall_s - last
    limit = max(ctx.config.stall_factor * med, ctx.config.stall_min_s)
    if idle < limit:
        return []
    step = int(t["step"].max())
    return [Finding(
        category="stall", severity="critical",
        message=(f"no step recorded for {idle:.0f} s since step {step} "
                 f"({idle / med:.0f}x the median step)" if med > 0 else
                 f"no step recorded for {idle:.0f} s since step {step}"),
        evidence={"idle_s": idle, "last_step": step, "median_step_time_s": med},
        steps=(step, step), rank=None, confidence=0.9, rule="health.stall",
        recommendation="Check the job now: py-spy dump the ranks; a hung collective or "
                       "retrying data reader are the usual causes",
    )]
