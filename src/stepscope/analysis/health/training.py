"""Health rules on the training itself: LR schedule, convergence, and whether metrics
reach stepscope at all. Pure functions ``rule(ctx) -> list[Finding]``.

Example::

    ctx = HealthContext(table, meta, HealthConfig(), steady_mask(table))
    rule_lr_schedule(ctx)     # restarts, peak/warm-up vs run.json
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._fastnp import unique_ints
from ...findings import Finding
from ...schema import AnyArray
from .config import HealthContext
from .stats import first_rank_with, rank_series

__all__ = ["rule_lr_schedule", "lr_restarts", "lr_jumps", "rule_convergence", "rule_logging"]

# Schedules whose restarts are intended (SGDR, cyclic, one-cycle variants).
_RESTARTING = ("restart", "cyclic", "cycle", "sgdr")


def lr_restarts(lr: AnyArray, jump_frac: float, near_frac: float) -> list[int]:
    """Indices where the LR jumps back to where the schedule started, or up to its peak
    after having decayed: an abrupt change of >= ``jump_frac`` x range landing within
    ``near_frac`` x range of the start (or of the peak reached earlier)."""
    x = lr[np.isfinite(lr)]
    idx = np.flatnonzero(np.isfinite(lr))
    if x.size < 3:
        return []
    span = float(x.max() - x.min())
    if span <= 1e-12 * max(abs(float(x.max())), 1e-30):
        return []
    start = x[0]
    out = []
    for i in range(2, x.size):
        if abs(x[i] - x[i - 1]) < jump_frac * span:
            continue
        back_to_start = (abs(x[i] - start) <= near_frac * span
                         and abs(x[i - 1] - start) > jump_frac * span)
        peak_before = x[:i].max()
        back_to_peak = (x[i] > x[i - 1] and abs(x[i] - peak_before) <= near_frac * span
                        and x[i - 1] < peak_before - jump_frac * span)
        if back_to_start or back_to_peak:
            out.append(int(idx[i]))
    return out


def lr_jumps(lr: AnyArray, jump_frac: float, settled: int = 5) -> list[int]:
    """Indices where the LR at least doubles in one step by >= ``jump_frac`` x its range
    after ``settled`` steps without any increase (so not a warm-up ramp)."""
    x = lr[np.isfinite(lr)]
    idx = np.flatnonzero(np.isfinite(lr))
    if x.size < settled + 2:
        return []
    span = float(x.max() - x.min())
    out = []
    for i in range(settled + 1, x.size):
        prev = x[i - settled - 1: i]
        if (x[i] >= 2 * x[i - 1] and x[i] - x[i - 1] >= jump_frac * span
                and np.all(np.diff(prev) <= 0)):
            out.append(int(idx[i]))
    return out


def rule_lr_schedule(ctx: HealthContext) -> list[Finding]:
    """LR restarts mid-run, and the observed peak / warm-up vs run.json's baseline."""
    r = first_rank_with(ctx.table, "lr")
    if r is None:
        return []
    steps, lr = rank_series(ctx.table, r, "lr")
    base = ctx.meta.baseline if ctx.meta else {}
    schedule = str(base.get("lr_schedule") or "")
    out = []
    restarts = lr_restarts(lr, ctx.config.lr_jump_frac, ctx.config.lr_near_frac)
    if restarts:
        intended = any(k in schedule.lower() for k in _RESTARTING)
        at = [int(steps[i]) for i in restarts]
        out.append(Finding(
            category="lr_schedule", severity="info" if intended else "warning",
            message=(f"learning rate restarted at step {at[0]}: {lr[restarts[0] - 1]:.3g} -> "
                     f"{lr[restarts[0]]:.3g}" + (f" ({len(at)} restarts)" if len(at) > 1 else "")
                     + (f"; configured schedule '{schedule}' restarts by design" if intended
                        else "; the scheduler was probably re-created or reset")),
            evidence={"restart_steps": at, "lr_before": float(lr[restarts[0] - 1]),
                      "lr_after": float(lr[restarts[0]]), "lr_start": float(lr[np.isfinite(lr)][0]),
                      "lr_max": float(np.nanmax(lr)), "configured_schedule": schedule or None},
            steps=(at[0], at[-1]), rank=r, confidence=0.9, rule="health.lr_schedule",
            recommendation=("Check that the LR scheduler is created once and restored with "
                            "the optimizer on resume (scheduler.state_dict()); some versions "
                            "reset it under parallel configs"),
        ))
    # a warm-up ramp right after a restart is part of that restart
    jumps = [i for i in lr_jumps(lr, ctx.config.lr_jump_frac)
             if not any(0 <= i - j <= 10 for j in restarts)]
    if jumps:
        i = jumps[0]
        out.append(Finding(
            category="lr_schedule", severity="warning",
            message=(f"learning rate jumped {lr[i] / lr[i - 1]:.3g}x at step {int(steps[i])}: "
                     f"{lr[i - 1]:.3g} -> {lr[i]:.3g}, after it had stopped rising"),
            evidence={"jump_steps": [int(steps[j]) for j in jumps],
                      "lr_before": float(lr[i - 1]), "lr_after": float(lr[i])},
            steps=(int(steps[i]), int(steps[jumps[-1]])), rank=r, confidence=0.9,
            rule="health.lr_schedule",
            recommendation="Check what set the LR at that step (a second scheduler, a manual "
                           "param_group edit, a resumed checkpoint with another config)"))
    out.extend(_vs_config(steps, lr, base, r, ctx))
    return out


def _vs_config(steps: AnyArray, lr: AnyArray, base: dict[str, Any], rank: int,
               ctx: HealthContext) -> list[Finding]:
    cfg = ctx.config
    ok = np.isfinite(lr)
    out: list[Finding] = []
    peak_cfg = base.get("lr")
    peak = float(lr[ok].max())
    first = float(lr[ok][0])
    # A value equal to the first observed LR, which later rises, was read from the optimizer
    # mid-warm-up (e.g. by zero-code instrumentation): it is the start, not the peak.
    read_at_start = (isinstance(peak_cfg, (int, float)) and peak_cfg > 0
                     and abs(first - peak_cfg) <= cfg.lr_peak_tolerance * peak_cfg
                     and peak > peak_cfg * (1 + cfg.lr_peak_tolerance))
    if isinstance(peak_cfg, (int, float)) and peak_cfg > 0 and not read_at_start:
        if abs(peak - peak_cfg) / peak_cfg > cfg.lr_peak_tolerance:
            out.append(Finding(
                category="lr_schedule", severity="warning",
                message=f"observed peak LR {peak:.3g} differs from the configured {peak_cfg:.3g}",
                evidence={"observed_peak": peak, "configured_peak": float(peak_cfg)},
                steps=(int(steps[ok][0]), int(steps[ok][-1])), rank=rank,
                rule="health.lr_schedule",
                recommendation="Check LR scaling rules (per-rank or batch-size scaling) and "
                               "the param group that is logged"))
    warm = base.get("warmup_steps")
    if not isinstance(warm, (int, float)) or warm < 2 or steps[ok][-1] - steps[ok][0] < warm:
        return out
    reached = int(steps[ok][np.flatnonzero(lr[ok] >= 0.95 * peak)[0]] - steps[ok][0])
    lo, hi = warm * cfg.lr_warmup_tolerance, warm / cfg.lr_warmup_tolerance + 1
    if not lo <= reached <= hi:
        what = "warm-up was not applied" if reached < lo else "warm-up is longer than configured"
        out.append(Finding(
            category="lr_schedule", severity="warning",
            message=f"{what}: LR reached its peak after {reached} steps, configured "
                    f"warmup_steps={int(warm)}",
            evidence={"observed_warmup_steps": reached, "configured_warmup_steps": int(warm)},
            steps=(int(steps[ok][0]), int(steps[ok][0]) + reached), rank=rank,
            rule="health.lr_schedule",
            recommendation="Check that the scheduler steps once per optimizer step (not per "
                           "micro-batch or epoch) and that warmup is counted in steps"))
    return out


def rule_convergence(ctx: HealthContext) -> list[Finding]:
    """Loss abnormally flat early, plateau late, or rising overall."""
    cfg = ctx.config
    r = first_rank_with(ctx.table, "loss")
    if r is None:
        return []
    steps, loss = rank_series(ctx.table, r, "loss")
    ok = np.isfinite(loss)
    x, st = loss[ok], steps[ok]
    if x.size < max(cfg.conv_min_total, 2 * cfg.conv_min_points):
        return _short_divergence(cfg.conv_short_rise_factor, x, st, r)
    n_early = max(cfg.conv_min_points, int(cfg.conv_early_frac * x.size))
    k = max(3, n_early // 4)
    e0, e1 = float(np.median(x[:k])), float(np.median(x[n_early - k: n_early]))
    q = max(3, x.size // 4)
    last = float(np.median(x[-q:]))
    scale = max(abs(e0), 1e-12)
    out: list[Finding] = []
    if last > e0 + cfg.conv_diverge_rise * scale:
        out.append(Finding(
            category="convergence", severity="warning",
            message=f"loss is rising: median {e0:.4g} at the start, {last:.4g} in the last quarter",
            evidence={"early_median": e0, "last_quarter_median": last},
            steps=(int(st[0]), int(st[-1])), rank=r, confidence=0.8, rule="health.convergence",
            recommendation="Lower the peak LR or lengthen warmup; check the LR schedule and "
                           "that labels match inputs"))
    elif (e0 - e1) / scale < cfg.conv_flat_drop:
        # Flat early and still flat at the end: not converging. Flat early only: a slow
        # start (deep nets, small LR), worth a look but not a warning.
        stuck = (e0 - last) / scale < cfg.conv_stuck_drop
        out.append(Finding(
            category="convergence", severity="warning" if stuck else "info",
            message=(f"loss is abnormally flat early: {e0:.4g} -> {e1:.4g} over the first "
                     f"{n_early} logged steps (a {(e1 - e0) / scale:+.2%} change)"),
            evidence={"early_start_median": e0, "early_end_median": e1,
                      "early_drop_frac": (e0 - e1) / scale, "early_points": n_early,
                      "total_drop_frac": (e0 - last) / scale},
            steps=(int(st[0]), int(st[n_early - 1])), rank=r, confidence=0.7,
            rule="health.convergence",
            recommendation="Check the LR (not zero, warmup applied), that data is not starved "
                           "or repeated (shuffle, sample count), and that gradients reach the "
                           "parameters (requires_grad, optimizer param groups)"))
    else:
        q0 = float(np.median(x[-2 * q: -q])) if x.size >= 2 * q else e1
        if (q0 - last) / scale < cfg.conv_plateau_drop:
            out.append(Finding(
                category="convergence", severity="info",
                message=f"loss plateaued in the last quarter at {last:.4g}",
                evidence={"previous_quarter_median": q0, "last_quarter_median": last},
                steps=(int(st[-q]), int(st[-1])), rank=r, confidence=0.6,
                rule="health.convergence",
                recommendation="Expected late in training; if early, try LR decay or a larger "
                               "model/more data"))
    return out


def _short_divergence(factor: float, x: AnyArray, st: AnyArray, r: int) -> list[Finding]:
    """A run too short for the trend windows still gets its blow-up named."""
    if x.size < 2 or x[0] <= 0 or x.max() < factor * x[0]:
        return []
    at = int(np.argmax(x))
    return [Finding(
        category="convergence", severity="warning",
        message=(f"loss diverged: {x[0]:.4g} at step {int(st[0])}, {x[at]:.4g} at step "
                 f"{int(st[at])} ({x[at] / x[0]:.3g}x) in {x.size} logged steps"),
        evidence={"first_loss": float(x[0]), "peak_loss": float(x[at]),
                  "peak_step": int(st[at]), "factor": float(x[at] / x[0])},
        steps=(int(st[0]), int(st[at])), rank=r, confidence=0.8, rule="health.convergence",
        recommendation="Lower the peak LR or lengthen warmup; check the LR schedule and "
                       "that labels match inputs")]


def _likely_cause(ctx: HealthContext) -> str:
    env = ctx.meta.environment if ctx.meta else {}
    framework = str(env.get("framework", "")).lower()
    if framework == "mindspore":
        return ("a custom training cell whose outputs give the callback no loss (the field "
                "report's empty loss curve): return the loss as the cell's first output "
                "(StepscopeCallback reads only the network's outputs); in a custom loop, "
                "pass it to LoopRecorder.log(loss=...)")
    if ctx.meta and ctx.meta.command:
        return ("`stepscope run` takes the loss from the tensor backward() is called on: the "
                "script may call backward through a wrapper, on a non-scalar, or use a hook "
                "stepscope does not see; log it with Recorder.log(loss=...)")
    return "no log(loss=...) call reached the recorder (callback never fired?)"


def rule_logging(ctx: HealthContext) -> list[Finding]:
    """Steps advance but no loss / LR / tokens recorded: metrics are not reaching stepscope."""
    t = ctx.table
    n_steps = int(unique_ints(t["step"]).size) if len(t) else 0
    if n_steps < ctx.config.logging_min_steps:
        return []
    span = (int(t["step"].min()), int(t["step"].max()))
    if not t.has_data("loss"):
        return [Finding(
            category="logging", severity="warning",
            message=(f"metrics are not reaching stepscope: {n_steps} steps recorded but no loss;"
                     f" likely cause: {_likely_cause(ctx)}"),
            evidence={"steps_recorded": n_steps, "missing": ["loss"]},
            steps=span, rank=None, rule="health.logging",
            recommendation="Make the loss reach the recorder before trusting any curve")]
    missing = [c for c in ("lr", "tokens") if not t.has_data(c)]
    if not missing:
        return []
    why = {"lr": "LR schedule checks are skipped", "tokens": "tokens/s and MFU are unavailable"}
    return [Finding(
        category="logging", severity="info",
        message="not recorded: " + "; ".join(f"{c} ({why[c]})" for c in missing),
        evidence={"steps_recorded": n_steps, "missing": missing},
        steps=span, rank=None, confidence=1.0, rule="health.logging",
        recommendation=_how_to_count(ctx, missing))]


def _how_to_count(ctx: HealthContext, missing: list[str]) -> str:
    """Advice in the terms of the integration that recorded the run (run.json config)."""
    how = str((ctx.meta.config if ctx.meta else {}).get("stepscope_integration", ""))
    tokens = "tokens" in missing
    if "Model.train callback" in how:
        return ("The callback counts token ids from a 2-D integer first input; for other "
                "inputs pass StepscopeCallback(tokens_per_sample=...)" if tokens else
                "Give the optimizer a learning rate the callback can read (get_lr())")
    if "LoopRecorder" in how:
        return "Pass tokens= to rec.step(batch, tokens=...) (or LoopRecorder(tokens_per_sample=" \
            "...)) and give LoopRecorder the optimizer"
    if ctx.meta and ctx.meta.command:
        return "Pass `stepscope run --tokens-per-step N` when the batch does not show tokens"
    return "Pass tokens=/samples= to rec.step() and log lr= each step"
