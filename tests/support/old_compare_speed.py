"""The speed ledger's sample as it was before the per-run reduction (commit 3891108): the
oracle only.

Kept verbatim (the whole ``summarize`` sheet for the MFU factor and memory peak, the
(steps x ranks) matrices of both runs held together, int64 unit indices and a weight per
row) so the tests can compare the ledger run by run against it, value for value. Not
used by stepscope.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from stepscope._fastnp import unique_ints
from stepscope.analysis.compare.sample import (
    METRICS,
    Stat,
    StepSample,
    _outlier_steps,
    shared_products,
    split_half_rel,
    spread_rel,
)
from stepscope.analysis.compare.speed import (
    _PRIMARY,
    CI_LEVEL,
    MIN_EFFECT_REL,
    MIN_SHARE_DIFF,
    N_BOOT,
    SpeedLedger,
    SpeedMetric,
    _Boot,
    _has,
    _judge,
    _none,
    _reason,
)
from stepscope.analysis.summary import Conditions, headline_mask, steady_mask, summarize
from stepscope.schema import RunMeta, StepTable


def _matrix(table, col, step_pos, rank_pos, shape):
    out = np.zeros(shape)
    vals = table[col]
    out[step_pos, rank_pos] = np.where(np.isfinite(vals), vals, 0.0)
    return out


def old_step_sample(table: StepTable, meta: RunMeta | None = None,
                    conditions: Conditions | None = None) -> StepSample:
    """Steady-state, outlier-free steps of one run (pure; the table is not modified):
    the headline steps of ``summary.headline_mask`` (the steady-state regime)."""
    mask = steady_mask(table)
    head, _ = headline_mask(table, conditions)
    steady = table.select(head) if head.any() else table
    steady = steady.select(np.isfinite(steady["step_time_s"]))
    steps, step_pos = unique_ints(steady["step"], return_inverse=True)
    ranks, rank_pos = unique_ints(steady["rank"], return_inverse=True)
    shape = (len(steps), len(ranks))
    cols = {c: _matrix(steady, c, step_pos, rank_pos, shape)
            for c in ("step_time_s", "tokens", "samples", "data_wait_s", "comm_exposed_s")}
    present = np.zeros(shape, dtype=bool)
    present[step_pos, rank_pos] = True
    out = _outlier_steps(cols["step_time_s"].max(axis=1)) if len(steps) else present[:, 0]
    keep = ~out
    t, p = cols["step_time_s"][keep], present[keep]
    unit = np.nonzero(p)[0]
    order = np.argsort(t[p], kind="stable")
    sheet = summarize(table, meta, conditions=conditions)
    factor = sheet.mfu / sheet.tokens_per_s if sheet.mfu and sheet.tokens_per_s else None
    return StepSample(
        step_time=t, tokens=cols["tokens"][keep],
        samples=cols["samples"][keep], data_wait=cols["data_wait_s"][keep],
        comm_exposed=cols["comm_exposed_s"][keep], present=p,
        rows_sorted=t[p][order], rows_unit=unit[order].astype(np.int64),
        rows_weight=np.ones(order.size),
        warmup_rows=int(len(table) - mask.sum()) if mask.any() else 0,
        outlier_steps=int(out.sum()), mfu_per_token_s=factor,
        mem_peak_bytes=sheet.mem_peak_bytes,
    )


def _point(name: str, s: StepSample) -> float | None:
    """The metric over all kept steps of one run (None when the run lacks its data)."""
    spec = METRICS[name]
    if not _has(s, spec.column):
        return None
    scale = 1.0
    if name == "mfu":
        if s.mfu_per_token_s is None:
            return None
        scale = s.mfu_per_token_s
    return _none(float(spec.stat(s, np.ones((1, s.n_steps)))[0]) * scale)


def _noise(name: str, sa: StepSample, sb: StepSample, repeats: Sequence[StepSample],
           a: float, min_effect_rel: float) -> float:
    """The runs' own noise for one metric (see module doc), relative."""
    spec = METRICS[name]
    parts = [split_half_rel(sa, spec.stat), split_half_rel(sb, spec.stat),
             spread_rel(sa, spec.per_step), spread_rel(sb, spec.per_step), min_effect_rel]
    for rep in repeats:  # measured run-to-run noise: the baseline against its repeat
        value = _point(name, rep)
        if value is not None:
            parts.append(abs(value / a - 1.0))
    return max(parts)


def _metric(name: str, sa: StepSample, sb: StepSample, repeats: Sequence[StepSample],
            boots: tuple[_Boot, _Boot], min_effect_rel: float) -> SpeedMetric:
    stat = METRICS[name].stat
    a, b = _point(name, sa), _point(name, sb)
    m = SpeedMetric(name, a, b, METRICS[name].better)
    if a is None or b is None or a == 0:
        return m
    m.diff, m.diff_rel = b - a, b / a - 1.0
    boot_a = boots[0].replicates(stat) * (a / _raw(sa, stat))
    boot_b = boots[1].replicates(stat) * (b / _raw(sb, stat))
    ok = np.isfinite(boot_a) & np.isfinite(boot_b) & (boot_a != 0)
    tail = (1.0 - CI_LEVEL) / 2 * 100
    d = np.percentile(boot_b[ok] - boot_a[ok], [tail, 100 - tail])
    r = np.percentile(boot_b[ok] / boot_a[ok] - 1.0, [tail, 100 - tail])
    m.ci, m.ci_rel = (float(d[0]), float(d[1])), (float(r[0]), float(r[1]))
    noise = _noise(name, sa, sb, repeats, a, min_effect_rel)
    m.noise_rel = _none(noise)
    m.change = _judge(m, m.ci_rel, noise)
    if m.is_share:
        m.diff_pp = 100.0 * m.diff
        if abs(m.diff) < MIN_SHARE_DIFF:
            m.change = "no significant difference"
    return m


def _raw(s: StepSample, stat: Stat) -> float:
    """The unscaled statistic (MFU's replicates are scaled by point / raw)."""
    return float(stat(s, np.ones((1, s.n_steps)))[0])


def _memory(sa: StepSample, sb: StepSample) -> SpeedMetric:
    # A peak is one number per run, not a per-step sample: no interval, and any growth
    # is reported as it is (memory is deterministic for a fixed configuration).
    m = SpeedMetric("mem_peak_bytes", sa.mem_peak_bytes, sb.mem_peak_bytes, "lower")
    if m.a and m.b is not None:
        m.diff, m.diff_rel = m.b - m.a, m.b / m.a - 1.0
        m.change = ("no significant difference" if m.diff == 0
                    else "better" if m.diff < 0 else "worse")
    return m


def old_speed_ledger(table_a: StepTable, meta_a: RunMeta | None, table_b: StepTable,
                     meta_b: RunMeta | None, *, seed: int = 0, n_boot: int = N_BOOT,
                     min_effect_rel: float = MIN_EFFECT_REL,
                     baseline_repeats: Sequence[tuple[StepTable, RunMeta | None]] = (),
                     conditions: tuple[Conditions | None, Conditions | None] = (None, None),
                     ) -> SpeedLedger:
    """Speed metrics of B against baseline A, each with a bootstrap interval and a call.

    ``baseline_repeats``: other runs of A's exact configuration; how far each lands from A
    is measured run-to-run noise, added to the noise a difference must exceed.

    Example::

        ledger = speed_ledger(ta, ma, tb, mb, seed=0)
        ledger.metrics["tokens_per_s"].ci_rel    # e.g. (0.081, 0.094): B is 8-9% faster
    """
    sa = old_step_sample(table_a, meta_a, conditions[0])
    sb = old_step_sample(table_b, meta_b, conditions[1])
    repeats = [old_step_sample(t, m) for t, m in baseline_repeats]
    metrics: dict[str, SpeedMetric] = {}
    if sa.n_steps and sb.n_steps:
        boots = (_Boot.of(sa, n_boot, seed, 0), _Boot.of(sb, n_boot, seed, 1))
        with shared_products([w for boot in boots for w in boot.weights]):
            for name in METRICS:
                metrics[name] = _metric(name, sa, sb, repeats, boots, min_effect_rel)
    metrics["mem_peak_bytes"] = _memory(sa, sb)
    primary = next((p for p in _PRIMARY if p in metrics and metrics[p].diff_rel is not None),
                   None)
    verdict = "no significant difference"
    if primary is not None:
        change = metrics[primary].change
        verdict = {"better": "faster", "worse": "slower"}.get(change, verdict)
    return SpeedLedger(
        verdict=verdict, primary=primary, metrics=metrics,
        steps_used=(sa.n_steps, sb.n_steps), seed=seed,
        reason=_reason(verdict, primary, metrics),
        excluded={"warmup_rows": (sa.warmup_rows, sb.warmup_rows),
                  "outlier_steps": (sa.outlier_steps, sb.outlier_steps)},
    )
