"""The speed ledger of an A/B comparison: each speed metric with a noise-aware interval.

Which steps count: the steady-state steps of ``summary.steady_mask`` (warm-up excluded),
minus outlier steps (a step whose slowest rank has a modified z-score of step time above
3.5; Iglewicz & Hoaglin, "How to Detect and Handle Outliers", 1993; when more than half
the steps are identical, MAD is 0 and 1.2533 x the mean absolute deviation stands in).
Both exclusions are counted in the result, never silent.

The metrics use the formulas of ``summary.summarize`` (one definition of tokens/s, MFU and
shares for every report): throughput is sum(tokens)/sum(step_time_s) per rank, summed over
ranks; a share is sum(phase time)/sum(step time) over all rows; step time is the median of
all rows; MFU is tokens/s times the run's own ``summarize`` MFU-per-token/s factor.

Uncertainty: a percentile bootstrap (Efron & Tibshirani 1993, ch. 13) over steps (a step
keeps all its ranks' rows together), each run resampled independently, gives an interval
for the relative difference B/A - 1. A difference counts only when that interval excludes
zero AND the point difference is larger than the runs' own noise, the largest of:
each run's step-to-step spread of the metric (robust sigma, 1.4826 x MAD, over the median),
each run's split-half disagreement (the metric on the first half of the kept steps vs the
second half: drift), and ``MIN_EFFECT_REL``. Why not the interval alone: it measures how
well the medians are known, not how much two launches of one configuration differ
(placement, allocator state, neighbours' load), which two runs cannot measure; the spread
and drift are the conservative stand-in. The seed is injected so results are reproducible.

Example::

    ledger = speed_ledger(table_a, meta_a, table_b, meta_b, seed=0)
    ledger.verdict            # "faster" | "slower" | "no significant difference"
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from ..schema import RunMeta, StepTable
from .summary import steady_mask, summarize

__all__ = [
    "SpeedMetric", "SpeedLedger", "StepSample", "speed_ledger", "step_sample",
    "OUTLIER_Z", "MIN_EFFECT_REL", "N_BOOT", "CI_LEVEL",
]

# Modified z-score above which a step is an outlier (Iglewicz & Hoaglin 1993, sec. 3.2).
OUTLIER_Z = 3.5
# 0.6745 = the 0.75 quantile of the standard normal: makes MAD a consistent sigma estimate
# (sigma = MAD / 0.6745 = 1.4826 x MAD for normal data).
_MAD_Z = 0.6745
_MAD_SIGMA = 1.0 / _MAD_Z
# When MAD is 0, sigma = 1.2533 x mean absolute deviation (sqrt(pi/2), the normal-data
# ratio of sigma to the mean absolute deviation), the usual fallback of the modified z.
_MEANAD_SIGMA = 1.2533
# Smallest relative difference ever called a change. stepscope's default (the field report
# gives none): below ~1% step-time medians of identical runs disagree even on a dedicated
# accelerator. Pass ``min_effect_rel`` to change it.
MIN_EFFECT_REL = 0.01
# Bootstrap replicates and interval level: 2000 replicates keep the 95% percentile
# interval's Monte-Carlo error small (Efron & Tibshirani 1993, sec. 19.3 suggest >= 1000).
N_BOOT = 2000
CI_LEVEL = 0.95
# Bound on floats held at once by the median bootstrap (replicates x steps x ranks).
_CHUNK_FLOATS = 4_000_000

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class StepSample:
    """Steady, non-outlier steps of one run as (steps x ranks) matrices; 0 where absent."""

    step_time: FloatArray
    tokens: FloatArray
    samples: FloatArray
    data_wait: FloatArray
    comm_exposed: FloatArray
    present: npt.NDArray[np.bool_]
    warmup_rows: int
    outlier_steps: int
    mfu_per_token_s: float | None  # summarize's MFU / tokens_per_s, None when unknown
    mem_peak_bytes: float | None

    @property
    def n_steps(self) -> int:
        return int(self.step_time.shape[0])


def _outlier_steps(slowest: FloatArray) -> npt.NDArray[np.bool_]:
    dev = np.abs(slowest - float(np.median(slowest)))
    mad = float(np.median(dev))
    if mad > 0:
        sigma = mad / _MAD_Z
    else:  # over half the steps identical: the mean absolute deviation stands in
        sigma = _MEANAD_SIGMA * float(np.mean(dev))
    if sigma <= 0:  # every step identical: nothing is an outlier
        return np.zeros(slowest.shape, dtype=bool)
    return np.asarray(dev / sigma > OUTLIER_Z)


def _matrix(table: StepTable, col: str, step_pos: npt.NDArray[np.int64],
            rank_pos: npt.NDArray[np.int64], shape: tuple[int, int]) -> FloatArray:
    out = np.zeros(shape)
    vals = table[col]
    out[step_pos, rank_pos] = np.where(np.isfinite(vals), vals, 0.0)
    return out


def step_sample(table: StepTable, meta: RunMeta | None = None) -> StepSample:
    """Steady-state, outlier-free steps of one run (pure; the table is not modified)."""
    mask = steady_mask(table)
    steady = table.select(mask) if mask.any() else table
    steady = steady.select(np.isfinite(steady["step_time_s"]))
    steps, step_pos = np.unique(steady["step"], return_inverse=True)
    ranks, rank_pos = np.unique(steady["rank"], return_inverse=True)
    shape = (len(steps), len(ranks))
    cols = {c: _matrix(steady, c, step_pos, rank_pos, shape)
            for c in ("step_time_s", "tokens", "samples", "data_wait_s", "comm_exposed_s")}
    present = np.zeros(shape, dtype=bool)
    present[step_pos, rank_pos] = True
    out = _outlier_steps(cols["step_time_s"].max(axis=1)) if len(steps) else present[:, 0]
    keep = ~out
    sheet = summarize(table, meta)
    factor = sheet.mfu / sheet.tokens_per_s if sheet.mfu and sheet.tokens_per_s else None
    return StepSample(
        step_time=cols["step_time_s"][keep], tokens=cols["tokens"][keep],
        samples=cols["samples"][keep], data_wait=cols["data_wait_s"][keep],
        comm_exposed=cols["comm_exposed_s"][keep], present=present[keep],
        warmup_rows=int(len(table) - mask.sum()) if mask.any() else 0,
        outlier_steps=int(out.sum()), mfu_per_token_s=factor,
        mem_peak_bytes=sheet.mem_peak_bytes,
    )


# -- statistics over step weights ------------------------------------------------------
# Each statistic maps (sample, weights) -> one value per replicate, where ``weights`` is a
# (replicates x steps) matrix of how often each step was drawn (all ones: the point value).
Stat = Callable[[StepSample, FloatArray], FloatArray]


def _throughput(col: str) -> Stat:
    def stat(s: StepSample, w: FloatArray) -> FloatArray:
        num = w @ getattr(s, col)
        den = w @ s.step_time
        with np.errstate(divide="ignore", invalid="ignore"):
            per_rank = np.where(den > 0, num / den, 0.0)
        total = per_rank.sum(axis=1)
        return np.asarray(np.where(total > 0, total, np.nan))
    return stat


def _share(col: str) -> Stat:
    def stat(s: StepSample, w: FloatArray) -> FloatArray:
        den = w @ s.step_time.sum(axis=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray((w @ getattr(s, col).sum(axis=1)) / den)
    return stat


def _median_step_time(s: StepSample, w: FloatArray) -> FloatArray:
    """Median over all kept rows, each step's rows repeated by its weight."""
    t = np.where(s.present, s.step_time, np.nan)
    n_boot, n_steps = w.shape
    if np.all(w == 1):
        return np.full(n_boot, float(np.nanmedian(t)))
    counts = w.astype(np.int64)
    sizes = counts.sum(axis=1)
    if not np.all(sizes == sizes[0]):  # e.g. the two halves of an odd split: row by row
        return np.array([np.nanmedian(t[np.repeat(np.arange(n_steps), c)]) for c in counts])
    out = np.empty(n_boot)
    chunk = max(1, _CHUNK_FLOATS // max(1, t.size))
    # Weights are drawn counts, so rebuilding the drawn steps from them is exact.
    idx = np.repeat(np.tile(np.arange(n_steps), (n_boot, 1)).ravel(),
                    counts.ravel()).reshape(n_boot, int(sizes[0]))
    for lo in range(0, n_boot, chunk):
        part = t[idx[lo:lo + chunk]].reshape(min(chunk, n_boot - lo), -1)
        out[lo:lo + chunk] = np.nanmedian(part, axis=1)
    return out


# name -> (statistic, which direction is better, column that must hold data)
_METRICS: dict[str, tuple[Stat, str, str]] = {
    "step_time_s": (_median_step_time, "lower", "step_time"),
    "tokens_per_s": (_throughput("tokens"), "higher", "tokens"),
    "samples_per_s": (_throughput("samples"), "higher", "samples"),
    "mfu": (_throughput("tokens"), "higher", "tokens"),
    "comm_exposed_frac": (_share("comm_exposed"), "lower", "comm_exposed"),
    "data_wait_frac": (_share("data_wait"), "lower", "data_wait"),
}
# The ledger's verdict follows the first of these both runs measured.
_PRIMARY = ("tokens_per_s", "samples_per_s", "step_time_s")


@dataclass
class SpeedMetric:
    """One metric of the ledger. ``ci_rel`` bounds B/A - 1; ``change`` is the call."""

    name: str
    a: float | None
    b: float | None
    better: str  # "lower" | "higher"
    diff: float | None = None
    diff_rel: float | None = None
    ci: tuple[float, float] | None = None
    ci_rel: tuple[float, float] | None = None
    noise_rel: float | None = None
    change: str = "unknown"  # "better" | "worse" | "no significant difference" | "unknown"

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a, "b": self.b, "better": self.better, "diff": self.diff,
            "diff_rel": self.diff_rel, "ci": list(self.ci) if self.ci else None,
            "ci_rel": list(self.ci_rel) if self.ci_rel else None,
            "noise_rel": self.noise_rel, "change": self.change,
        }


@dataclass
class SpeedLedger:
    verdict: str  # "faster" | "slower" | "no significant difference"
    primary: str | None
    metrics: dict[str, SpeedMetric]
    steps_used: tuple[int, int]
    excluded: dict[str, tuple[int, int]] = field(default_factory=dict)
    ci_level: float = CI_LEVEL
    seed: int = 0

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: m.to_dict() for k, m in self.metrics.items()}
        out.update(verdict=self.verdict, primary=self.primary, ci_level=self.ci_level,
                   steps_used=list(self.steps_used), seed=self.seed,
                   excluded={k: list(v) for k, v in self.excluded.items()})
        return out


def _none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _weights(rng: np.random.Generator, n_steps: int, n_boot: int) -> FloatArray:
    draws = rng.integers(0, n_steps, size=(n_boot, n_steps))
    offs = (np.arange(n_boot) * n_steps)[:, None]
    counts = np.bincount((draws + offs).ravel(), minlength=n_boot * n_steps)
    return counts.reshape(n_boot, n_steps).astype(np.float64)


def _split_half_rel(s: StepSample, stat: Stat) -> float:
    n = s.n_steps
    if n < 4:
        return math.inf
    w = np.zeros((2, n))
    w[0, : n // 2] = 1.0
    w[1, n // 2:] = 1.0
    h = stat(s, w)
    mean = float(np.mean(h))
    return abs(float(h[0] - h[1])) / abs(mean) if mean else math.inf


def _spread_rel(s: StepSample, stat: Stat) -> float:
    """Robust step-to-step spread of the metric: 1.4826 x MAD / median of per-step values."""
    if s.n_steps < 4:
        return math.inf
    per_step = stat(s, np.eye(s.n_steps))
    per_step = per_step[np.isfinite(per_step)]
    if not per_step.size:
        return math.inf
    med = float(np.median(per_step))
    return _MAD_SIGMA * float(np.median(np.abs(per_step - med))) / abs(med) if med else math.inf


def _has(s: StepSample, col: str) -> bool:
    return s.n_steps > 0 and bool(np.any(getattr(s, col) > 0))


def _judge(m: SpeedMetric, ci_rel: tuple[float, float], noise: float) -> str:
    assert m.diff_rel is not None
    if not (ci_rel[0] > 0 or ci_rel[1] < 0) or abs(m.diff_rel) <= noise:
        return "no significant difference"
    up = m.diff_rel > 0
    return "better" if up == (m.better == "higher") else "worse"


def _metric(name: str, sa: StepSample, sb: StepSample, wa: FloatArray, wb: FloatArray,
            min_effect_rel: float) -> SpeedMetric:
    stat, better, col = _METRICS[name]
    m = SpeedMetric(name, None, None, better)
    if not (_has(sa, col) and _has(sb, col)):
        return m
    scale_a = scale_b = 1.0
    if name == "mfu":
        if sa.mfu_per_token_s is None or sb.mfu_per_token_s is None:
            return m
        scale_a, scale_b = sa.mfu_per_token_s, sb.mfu_per_token_s
    a = float(stat(sa, np.ones((1, sa.n_steps)))[0]) * scale_a
    b = float(stat(sb, np.ones((1, sb.n_steps)))[0]) * scale_b
    m.a, m.b = _none(a), _none(b)
    if m.a is None or m.b is None or a == 0:
        return m
    m.diff, m.diff_rel = b - a, b / a - 1.0
    boot_a, boot_b = stat(sa, wa) * scale_a, stat(sb, wb) * scale_b
    ok = np.isfinite(boot_a) & np.isfinite(boot_b) & (boot_a != 0)
    tail = (1.0 - CI_LEVEL) / 2 * 100
    d = np.percentile(boot_b[ok] - boot_a[ok], [tail, 100 - tail])
    r = np.percentile(boot_b[ok] / boot_a[ok] - 1.0, [tail, 100 - tail])
    m.ci, m.ci_rel = (float(d[0]), float(d[1])), (float(r[0]), float(r[1]))
    noise = max(_split_half_rel(sa, stat), _split_half_rel(sb, stat),
                _spread_rel(sa, stat), _spread_rel(sb, stat), min_effect_rel)
    m.noise_rel = _none(noise)
    m.change = _judge(m, m.ci_rel, noise)
    return m


def _memory(sa: StepSample, sb: StepSample) -> SpeedMetric:
    # A peak is one number per run, not a per-step sample: no interval, and any growth
    # is reported as it is (memory is deterministic for a fixed configuration).
    m = SpeedMetric("mem_peak_bytes", sa.mem_peak_bytes, sb.mem_peak_bytes, "lower")
    if m.a and m.b is not None:
        m.diff, m.diff_rel = m.b - m.a, m.b / m.a - 1.0
        m.change = ("no significant difference" if m.diff == 0
                    else "better" if m.diff < 0 else "worse")
    return m


def speed_ledger(table_a: StepTable, meta_a: RunMeta | None, table_b: StepTable,
                 meta_b: RunMeta | None, *, seed: int = 0, n_boot: int = N_BOOT,
                 min_effect_rel: float = MIN_EFFECT_REL) -> SpeedLedger:
    """Speed metrics of B against baseline A, each with a bootstrap interval and a call.

    Example::

        ledger = speed_ledger(ta, ma, tb, mb, seed=0)
        ledger.metrics["tokens_per_s"].ci_rel    # e.g. (0.081, 0.094): B is 8-9% faster
    """
    sa, sb = step_sample(table_a, meta_a), step_sample(table_b, meta_b)
    metrics: dict[str, SpeedMetric] = {}
    if sa.n_steps and sb.n_steps:
        rng = np.random.default_rng(seed)
        wa, wb = _weights(rng, sa.n_steps, n_boot), _weights(rng, sb.n_steps, n_boot)
        for name in _METRICS:
            metrics[name] = _metric(name, sa, sb, wa, wb, min_effect_rel)
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
        excluded={"warmup_rows": (sa.warmup_rows, sb.warmup_rows),
                  "outlier_steps": (sa.outlier_steps, sb.outlier_steps)},
    )
