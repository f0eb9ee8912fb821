"""Health rules on numerics: non-finite values, overflow skips, loss spikes, gradient norm,
dynamic loss scale. Pure functions ``rule(ctx) -> list[Finding]``.

A NaN the training produced is read exactly: the store writes it as "NaN" and readers add a
``<column>_nan`` flag column. Integrations that drop non-finite values before logging leave
a gap instead, in a column otherwise recorded every step; :func:`nonfinite_index` reads
both (and explicit +-Inf values).

Example::

    ctx = HealthContext(table, meta, HealthConfig(), steady_mask(table))
    for f in rule_loss_spikes(ctx): print(f.steps, f.message)
"""

from __future__ import annotations

import numpy as np

from ...findings import Finding
from ...schema import AnyArray, StepTable
from .config import HealthContext
from .stats import (
    by_rank,
    first_rank_with,
    quarter_medians,
    rank_series,
    runs_of,
    trailing_median,
    trailing_robust_z,
)

__all__ = ["nonfinite_index", "rule_numerics", "rule_overflow", "rule_loss_spikes",
           "rule_grad_norm", "rule_loss_scale", "backoff_steps"]


def nonfinite_index(values: AnyArray, steps: AnyArray,
                    nan_flags: AnyArray | None = None) -> AnyArray:
    """Indices of values that are non-finite, or missing inside an every-step series.

    Explicit: +-Inf values and rows whose ``nan_flags`` is 1 (a recorded NaN). Inferred: when
    consecutive recorded steps are one apart (median gap 1), every missing value after the
    first recorded one, except a gap made only of the final row (a record lost at exit).
    """
    explicit = np.isinf(values)
    if nan_flags is not None:
        explicit |= np.nan_to_num(nan_flags, nan=0.0) >= 1
    present = np.isfinite(values)
    if present.sum() < 3 or np.median(np.diff(steps[present])) != 1:
        return np.flatnonzero(explicit)
    first = int(np.flatnonzero(present)[0])
    gap = ~present
    gap[: first + 1] = False
    if gap.sum() == 1 and gap[-1]:
        gap[-1] = False
    return np.flatnonzero(gap | explicit)


def _nonfinite_suspects(t: StepTable) -> list[int]:
    """The ranks in which :func:`nonfinite_index` can find anything in ``loss`` or
    ``grad_norm``, all ranks at once: an Inf or a NaN flag (explicit), or a missing value
    where at least 3 are finite (a gap it may infer). The others give it no index at all
    (all finite; or fewer than 3 finite and nothing explicit), so :func:`rule_numerics`
    judges only these and finds what it would over every rank."""
    flags = [f"{c}_nan" for c in ("loss", "grad_norm") if f"{c}_nan" in t]
    ranks, bounds, (loss, gn, *flagged) = by_rank(t, "loss", "grad_norm", *flags)
    if not ranks.size:
        return []
    starts = bounds[:-1]
    could = np.zeros(ranks.size, dtype=bool)
    for v in (loss, gn):
        finite = np.isfinite(v)
        could |= np.logical_or.reduceat(np.isinf(v), starts)
        n_finite = np.add.reduceat(finite.astype(np.int64), starts)
        could |= (n_finite >= 3) & (n_finite < np.diff(bounds))
    for f in flagged:
        could |= np.logical_or.reduceat(np.nan_to_num(f, nan=0.0) >= 1, starts)
    return [int(r) for r in ranks[could]]


def _flags(table: StepTable, rank: int, col: str) -> AnyArray | None:
    name = f"{col}_nan"
    return rank_series(table, rank, name)[1] if name in table else None


def _explicit(table: StepTable, rank: int, col: str) -> bool:
    """True when the rank recorded a NaN (flag) or an Inf in ``col``."""
    flags = _flags(table, rank, col)
    values = rank_series(table, rank, col)[1]
    return bool(np.isinf(values).any()) or bool(flags is not None and (flags >= 1).any())


def _overflow_at(table_overflow: AnyArray) -> AnyArray:
    return np.nan_to_num(table_overflow, nan=0.0) >= 1


def rule_numerics(ctx: HealthContext) -> list[Finding]:
    """NaN/Inf loss or gradient norm (not counting fp16 overflow steps that were skipped)."""
    t = ctx.table
    hits: list[tuple[int, AnyArray, list[str], float]] = []
    for r in _nonfinite_suspects(t):
        steps, loss = rank_series(t, r, "loss")
        _, gn = rank_series(t, r, "grad_norm")
        _, ovf = rank_series(t, r, "overflow")
        skipped = _overflow_at(ovf)  # skipped by the loss scaler: the overflow rule's
        bad_loss = nonfinite_index(loss, steps, _flags(t, r, "loss"))
        bad_loss = bad_loss[~skipped[bad_loss]]
        bad_gn = nonfinite_index(gn, steps, _flags(t, r, "grad_norm"))
        bad_gn = bad_gn[~skipped[bad_gn]]
        bad = np.union1d(bad_loss, bad_gn)
        if not bad.size:
            continue
        cols = [c for c, b in (("loss", bad_loss), ("grad_norm", bad_gn)) if b.size]
        # A recorded NaN/Inf is certain; loss and grad norm missing together is NaN/Inf,
        # not a logging hiccup (0.9); a gap in one column alone may be logging (0.6).
        if _explicit(t, r, "loss") or _explicit(t, r, "grad_norm"):
            conf = 1.0
        else:
            conf = 0.9 if np.intersect1d(bad_loss, bad_gn).size else 0.6
        hits.append((r, steps[bad], cols, conf))
    if not hits:
        return []
    r, bad_steps, cols, conf = min(hits, key=lambda h: int(h[1][0]))
    first, last = int(bad_steps[0]), int(bad_steps[-1])
    ranks = sorted(h[0] for h in hits)
    return [Finding(
        category="numerics", severity="critical",
        message=(f"{' and '.join(cols)} became non-finite (NaN/Inf) at step {first} on rank "
                 f"{r}; {len(bad_steps)} step(s) affected up to step {last}"),
        evidence={"first_nonfinite_step": first, "last_nonfinite_step": last,
                  "nonfinite_steps": len(bad_steps), "columns": cols, "ranks": ranks,
                  "source": ("recorded NaN/Inf values" if conf == 1.0 else
                             "gaps in a column recorded every step (NaN dropped before "
                             "logging)")},
        steps=(first, last), rank=r, confidence=conf, rule="health.numerics",
        recommendation=(f"Re-run steps {max(0, first - 2)}..{first} from a checkpoint with "
                        "anomaly detection (torch.autograd.set_detect_anomaly / MindSpore "
                        "overflow dump) to find the first op producing NaN; inspect that "
                        "step's batch and LR"),
    )]


def rule_overflow(ctx: HealthContext) -> list[Finding]:
    """Updates skipped for inf/NaN gradients (``overflow`` column = 1), counted over every
    recorded step of the first rank that has the column (a short run's warm-up included:
    a run whose every update was skipped trained nothing, whatever its length)."""
    r = first_rank_with(ctx.table, "overflow")
    if r is None:
        return []
    steps, col = rank_series(ctx.table, r, "overflow")
    known = np.isfinite(col)
    steps, ovf = steps[known], _overflow_at(col[known])
    n, m = int(ovf.sum()), int(known.sum())
    if not n:
        return []
    frac = n / m
    skipped = steps[ovf]
    sev = "critical" if n == m else "warning" if frac > ctx.config.overflow_warn_frac \
        else "info"
    what = (f"0 of {m} updates applied" if n == m else f"{n} of {m} updates skipped")
    return [Finding(
        category="numerics", severity=sev,
        message=f"{what}: inf/NaN gradients (loss-scale overflow), {frac:.1%} of steps",
        evidence={"overflow_steps": n, "steps_with_flag": m, "overflow_frac": frac,
                  "first_steps": [int(s) for s in skipped[:10]]},
        steps=(int(skipped[0]), int(skipped[-1])), rank=r, rule="health.overflow",
        recommendation="Few skips are normal with a dynamic loss scale; many mean a layer "
                       "overflows in fp16: prefer bf16, or find the layer (per-layer grad "
                       "norms) and keep it in fp32",
    )]


def rule_loss_spikes(ctx: HealthContext) -> list[Finding]:
    """Loss spikes: robust z over a trailing window (OLMo) and sustained 2x (LLM-Foundry)."""
    cfg = ctx.config
    r = first_rank_with(ctx.table, "loss")
    if r is None:
        return []
    steps, x = rank_series(ctx.table, r, "loss")
    x = np.where(np.isfinite(x), x, np.nan)
    med = trailing_median(x, cfg.spike_window, cfg.spike_min_periods)
    z = trailing_robust_z(x, cfg.spike_window, cfg.spike_min_periods, cfg.robust_rel_floor)
    with np.errstate(invalid="ignore"):
        rise = x - med >= (cfg.spike_min_ratio - 1) * np.abs(med)
        spike = (z >= cfg.spike_z) & rise
        w = np.lib.stride_tricks.sliding_window_view(
            np.concatenate([np.full(cfg.spike_window, np.nan), x[:-1]]), cfg.spike_window)
        cnt = np.isfinite(w).sum(axis=1)
        total = np.concatenate([np.nansum(w[i:i + 8192], axis=1)  # bounded copies of w
                                for i in range(0, len(w), 8192)]) if len(w) else cnt * 0.0
        mean = np.where(cnt >= cfg.spike_min_periods, total / np.maximum(cnt, 1), np.nan)
        high = x >= cfg.sustained_ratio * mean
    sustained = [(a, b) for a, b in runs_of(high) if b - a + 1 > cfg.sustained_steps]
    events = runs_of(spike)
    out: list[Finding] = []
    for a, b in sustained:
        out.append(_spike_finding(steps, x, med, z, a, b, r, sustained=True))
    for a, b in events:
        if any(sa <= a <= sb for sa, sb in sustained):
            continue
        out.append(_spike_finding(steps, x, med, z, a, b, r, sustained=False))
    out.sort(key=lambda f: f.steps or (0, 0))
    if len(out) > cfg.max_spike_findings:
        extra = out[cfg.max_spike_findings:]
        out = out[: cfg.max_spike_findings]
        out[-1].evidence["more_spikes_at"] = [f.steps[0] for f in extra if f.steps]
    return out


def _spike_finding(steps: AnyArray, x: AnyArray, med: AnyArray, z: AnyArray,
                   a: int, b: int, rank: int, sustained: bool) -> Finding:
    peak = a + int(np.nanargmax(x[a: b + 1]))
    ratio = float(x[peak] / med[a]) if med[a] else float("inf")
    s0, s1 = int(steps[a]), int(steps[b])
    where = f"step {s0}" if s0 == s1 else f"steps {s0}-{s1}"
    kind = "sustained loss spike" if sustained else "loss spike"
    return Finding(
        category="loss_spike", severity="critical" if sustained else "warning",
        message=(f"{kind} at {where}: loss {x[peak]:.4g} vs trailing median {med[a]:.4g} "
                 f"({ratio:.2f}x, robust z {z[peak]:.1f})"),
        evidence={"step": int(steps[peak]), "loss": float(x[peak]),
                  "window_median": float(med[a]), "ratio": ratio,
                  "robust_z": float(z[peak]) if np.isfinite(z[peak]) else None,
                  "length_steps": b - a + 1},
        steps=(s0, s1), rank=rank, confidence=0.9, rule="health.loss_spike",
        recommendation=(f"Dump and inspect the batch(es) of {where} (data order is "
                        "reproducible with the seed) and the grad norm/LR there; if spikes "
                        "recur, lower the peak LR or clip gradients (max_norm=1.0)"),
    )


def backoff_steps(table_steps: AnyArray, scale: AnyArray) -> AnyArray:
    """Steps at which the dynamic loss scale decreased (a backoff after an overflow)."""
    ok = np.isfinite(scale)
    s, st = scale[ok], table_steps[ok]
    out: AnyArray = st[1:][s[1:] < s[:-1]]
    return out


def rule_grad_norm(ctx: HealthContext) -> list[Finding]:
    """Gradient-norm jumps, sustained growth, vanishing; jumps at loss-scale backoffs."""
    cfg = ctx.config
    r = first_rank_with(ctx.table, "grad_norm")
    if r is None:
        return []
    steps, g = rank_series(ctx.table, r, "grad_norm")
    ok = np.isfinite(g) & (g > 0)
    if ok.sum() < cfg.min_steps:
        return []
    lg = np.where(ok, np.log10(np.where(ok, g, 1.0)), np.nan)
    med = trailing_median(lg, cfg.grad_window, cfg.spike_min_periods)
    z = trailing_robust_z(lg, cfg.grad_window, cfg.spike_min_periods, 0.0)
    with np.errstate(invalid="ignore"):
        jump = (lg - med >= np.log10(cfg.grad_jump_factor)) & (z >= cfg.spike_z)
    jump_steps = steps[jump]
    out: list[Finding] = []
    _, scale = rank_series(ctx.table, r, "loss_scale")
    backoffs = backoff_steps(steps, scale)
    if jump_steps.size:
        near = np.array([np.abs(backoffs - s).min() <= 1 if backoffs.size else False
                         for s in jump_steps])
        periodic = (jump_steps.size >= cfg.grad_scale_min_jumps
                    and near.mean() >= cfg.grad_scale_coincide_frac)
        out.append(_jump_finding(jump_steps, g[jump], 10 ** med[jump], r, periodic,
                                 int(near.sum())))
    first, last = quarter_medians(g[ok])
    if first > 0 and last / first >= cfg.grad_growth_factor:
        out.append(_trend_finding("grows", first, last, steps[ok], r))
    elif first > 0 and last / first <= cfg.grad_vanish_factor:
        out.append(_trend_finding("vanishes", first, last, steps[ok], r))
    return out


def _jump_finding(steps: AnyArray, g: AnyArray, med: AnyArray, rank: int,
                  periodic: bool, coinciding: int) -> Finding:
    s0, s1 = int(steps[0]), int(steps[-1])
    factor = float(np.max(g / med))
    if periodic:
        msg = (f"gradient norm jumps at {steps.size} steps ({s0}..{s1}), {coinciding} of them "
               "at loss-scale backoffs: the loss scale is oscillating; look for the layer "
               "producing NaN/overflow")
        rec = ("Log per-layer gradient norms around a backoff step to find the layer that "
               "overflows in fp16; keep it in fp32 or switch to bf16")
    else:
        msg = (f"gradient norm jumped up to {factor:.0f}x its trailing median at "
               f"{steps.size} step(s), first at step {s0}")
        rec = ("Check the batch and LR at the first jump step; clip gradients "
               "(max_norm=1.0) and, if jumps recur, lower the peak LR or lengthen warmup")
    return Finding(
        category="grad_norm", severity="warning", message=msg,
        evidence={"jump_steps": [int(s) for s in steps[:20]], "max_factor": factor,
                  "at_loss_scale_backoff": coinciding},
        steps=(s0, s1), rank=rank, confidence=0.8, rule="health.grad_norm",
        recommendation=rec,
    )


def _trend_finding(kind: str, first: float, last: float, steps: AnyArray,
                   rank: int) -> Finding:
    what = "explosion (sustained growth)" if kind == "grows" else "vanishing gradients"
    rec = ("Lower the LR or add/adjust gradient clipping; check for an LR schedule that "
           "restarted" if kind == "grows" else
           "Check for a loss scale collapsing to underflow, dead activations or an LR "
           "decayed to zero; log per-layer gradient norms")
    return Finding(
        category="grad_norm", severity="warning",
        message=(f"gradient norm {kind}: median {first:.3g} in the first quarter, "
                 f"{last:.3g} in the last ({last / first:.3g}x) - {what}"),
        evidence={"first_quarter_median": first, "last_quarter_median": last,
                  "factor": last / first},
        steps=(int(steps[0]), int(steps[-1])), rank=rank, confidence=0.7,
        rule="health.grad_norm", recommendation=rec,
    )


_SCALE_BOUND_KEYS = ("loss_scale_min", "min_loss_scale", "loss_scale_max", "max_loss_scale")


def rule_loss_scale(ctx: HealthContext) -> list[Finding]:
    """Loss scale thrash (frequent backoff), collapse, unbounded growth, bounds unknown."""
    cfg = ctx.config
    r = first_rank_with(ctx.table, "loss_scale")
    if r is None:
        return []
    steps, s = rank_series(ctx.table, r, "loss_scale")
    ok = np.isfinite(s)
    steps, s = steps[ok], s[ok]
    backoffs = backoff_steps(steps, s)
    out: list[Finding] = []
    span = (int(steps[0]), int(steps[-1]))
    ev = {"min": float(s.min()), "max": float(s.max()), "last": float(s[-1]),
          "backoffs": int(backoffs.size)}
    if s[-1] <= cfg.scale_collapse_at:
        at = int(steps[np.flatnonzero(s <= cfg.scale_collapse_at)[0]])
        out.append(Finding(
            category="loss_scale", severity="critical",
            message=(f"loss scale collapsed to {s[-1]:.3g} (max {s.max():.3g}) from step {at}:"
                     " fp16 gradients underflow to zero, NaN usually follows"),
            evidence=ev | {"collapsed_at_step": at}, steps=(at, span[1]), rank=r,
            rule="health.loss_scale", recommendation=(
                "Find the layer that overflows every step (per-layer grad norms at a backoff);"
                " set a floor on the scale (MindSpore DynamicLossScaleManager / DeepSpeed "
                "min_loss_scale) or train in bf16")))
    per_1000 = 1000.0 * backoffs.size / max(1, span[1] - span[0] + 1)
    if backoffs.size >= cfg.scale_thrash_min_backoffs and per_1000 >= cfg.scale_thrash_per_1000:
        out.append(Finding(
            category="loss_scale", severity="warning",
            message=(f"loss scale thrashes: {backoffs.size} backoffs in {span[1] - span[0] + 1}"
                     f" steps ({per_1000:.0f} per 1000 steps)"),
            evidence=ev | {"backoffs_per_1000_steps": per_1000,
                           "backoff_steps": [int(b) for b in backoffs[:20]]},
            steps=(int(backoffs[0]), int(backoffs[-1])), rank=r, rule="health.loss_scale",
            recommendation="A layer overflows repeatedly: find it with per-layer grad norms, "
                           "or lengthen the growth interval / use bf16"))
    if s.max() >= cfg.scale_unbounded_at and np.any(np.diff(s) > 0):  # it grew, not only fell
        out.append(Finding(
            category="loss_scale", severity="warning",
            message=f"loss scale grew to {s.max():.3g} with no upper bound",
            evidence=ev, steps=span, rank=r, rule="health.loss_scale",
            recommendation="Cap the scale (e.g. 2**24) so one overflow does not cost many "
                           "skipped steps; check whether gradients are tiny (vanishing)"))
    cfgd = {**(ctx.meta.config if ctx.meta else {}), **(ctx.meta.baseline if ctx.meta else {})}
    if not any(k in cfgd for k in _SCALE_BOUND_KEYS):
        out.append(Finding(
            category="loss_scale", severity="info",
            message="dynamic loss-scale bounds (min/max) are not recorded in run.json",
            evidence=ev, steps=span, rank=r, confidence=0.5, rule="health.loss_scale",
            recommendation="Record and widen the loss-scale range (field report: expose its "
                           "min/max at baseline time)"))
    return out
