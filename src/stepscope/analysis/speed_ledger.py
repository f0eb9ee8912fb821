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

import dataclasses
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
    "OUTLIER_Z", "MIN_EFFECT_REL", "N_BOOT", "CI_LEVEL", "MAX_BOOT_UNITS",
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
# Runs with more steady steps are resampled in blocks of consecutive steps (at most this
# many blocks): the non-overlapping block bootstrap (Carlstein 1986), which bounds the cost
# on long runs and keeps the step-time autocorrelation inside a block.
MAX_BOOT_UNITS = 1000
# Above this many rows (steps x ranks), the median bootstrap works on per-unit quantile
# summaries of the rows instead of every row (stepscope's bound: ~1 s for 2000 replicates).
_EXACT_MEDIAN_ROWS = 50_000
# Bound on floats held at once by one chunk of bootstrap replicates.
_CHUNK_FLOATS = 4_000_000

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class StepSample:
    """Steady, non-outlier steps of one run as (units x ranks) matrices; 0 where absent.

    A unit is one step, or (``blocked``) a block of consecutive steps whose columns are
    summed. ``rows_sorted`` holds every present row's step time in ascending order and
    ``rows_unit`` the unit of each, for medians under unit weights.
    """

    step_time: FloatArray
    tokens: FloatArray
    samples: FloatArray
    data_wait: FloatArray
    comm_exposed: FloatArray
    present: npt.NDArray[np.bool_]
    rows_sorted: FloatArray
    rows_unit: npt.NDArray[np.int64]
    rows_weight: FloatArray  # how many rows each entry stands for (1 unless thinned)
    warmup_rows: int
    outlier_steps: int
    mfu_per_token_s: float | None  # summarize's MFU / tokens_per_s, None when unknown
    mem_peak_bytes: float | None

    @property
    def n_steps(self) -> int:
        return int(self.step_time.shape[0])

    def blocked(self, max_units: int) -> StepSample:
        """Consecutive steps summed into at most ``max_units`` blocks (same totals)."""
        n = self.n_steps
        length = -(-n // max_units) if n > max_units else 1
        if length == 1:
            return self._thinned()
        unit = np.arange(n) // length
        starts = np.arange(0, n, length)

        def agg(m: FloatArray) -> FloatArray:
            return np.asarray(np.add.reduceat(m, starts, axis=0))

        return dataclasses.replace(
            self, step_time=agg(self.step_time), tokens=agg(self.tokens),
            samples=agg(self.samples), data_wait=agg(self.data_wait),
            comm_exposed=agg(self.comm_exposed),
            present=np.add.reduceat(self.present, starts, axis=0) > 0,
            rows_unit=unit[self.rows_unit])._thinned()

    def _thinned(self) -> StepSample:
        """Rows of each unit summarised by ``k`` evenly spaced quantiles when there are
        more than ``_EXACT_MEDIAN_ROWS`` rows (many ranks): bounds the median bootstrap."""
        n_units = self.n_steps
        if self.rows_sorted.size <= _EXACT_MEDIAN_ROWS or not n_units:
            return self
        k = max(1, _EXACT_MEDIAN_ROWS // n_units)
        order = np.lexsort((self.rows_sorted, self.rows_unit))  # by unit, then value
        count = np.bincount(self.rows_unit, minlength=n_units)
        start = np.concatenate(([0], np.cumsum(count)[:-1]))
        has = np.flatnonzero(count)
        pos = start[has, None] + ((np.arange(k) + 0.5) * count[has, None] / k).astype(np.int64)
        vals = self.rows_sorted[order][pos].ravel()
        units = np.repeat(has, k)
        weight = np.repeat(count[has] / k, k).astype(np.float64)
        by_value = np.argsort(vals, kind="stable")
        return dataclasses.replace(self, rows_sorted=vals[by_value],
                                   rows_unit=units[by_value], rows_weight=weight[by_value])


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
    t, p = cols["step_time_s"][keep], present[keep]
    unit = np.nonzero(p)[0]
    order = np.argsort(t[p], kind="stable")
    sheet = summarize(table, meta)
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


# -- statistics over unit weights --------------------------------------------------------
# Each statistic maps (sample, weights) -> one value per replicate, where ``weights`` is a
# (replicates x units) matrix of how often each unit was drawn (all ones: the point value).
Stat = Callable[[StepSample, FloatArray], FloatArray]
# Each per-step function gives the metric of every single step (for the spread).
PerStep = Callable[[StepSample], FloatArray]


def _throughput(col: str) -> tuple[Stat, PerStep]:
    def ratio(num: FloatArray, den: FloatArray) -> FloatArray:
        with np.errstate(divide="ignore", invalid="ignore"):
            total = np.where(den > 0, num / den, 0.0).sum(axis=-1)
        return np.asarray(np.where(total > 0, total, np.nan))

    def stat(s: StepSample, w: FloatArray) -> FloatArray:
        return ratio(w @ getattr(s, col), w @ s.step_time)

    def per_step(s: StepSample) -> FloatArray:
        return ratio(getattr(s, col), s.step_time)
    return stat, per_step


def _share(col: str) -> tuple[Stat, PerStep]:
    def stat(s: StepSample, w: FloatArray) -> FloatArray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray((w @ getattr(s, col).sum(axis=1)) / (w @ s.step_time.sum(axis=1)))

    def per_step(s: StepSample) -> FloatArray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(getattr(s, col).sum(axis=1) / s.step_time.sum(axis=1))
    return stat, per_step


def _median_stat(s: StepSample, w: FloatArray) -> FloatArray:
    """Median of all kept rows, each row weighted by its unit's weight.

    Sorted once; per replicate the median is where the cumulative weight crosses half
    (the mean of the two middle rows when it lands exactly on half, as ``np.median``).
    """
    v = s.rows_sorted
    if np.all(w == 1):
        return np.full(w.shape[0], float(np.median(v)) if v.size else math.nan)
    out = np.empty(w.shape[0])
    chunk = max(1, _CHUNK_FLOATS // max(1, v.size))
    for lo in range(0, w.shape[0], chunk):
        cw = np.cumsum(w[lo:lo + chunk][:, s.rows_unit] * s.rows_weight, axis=1)
        half = cw[:, -1:] / 2.0
        i_lo = np.argmax(cw >= half, axis=1)
        i_hi = np.argmax(cw > half, axis=1)
        out[lo:lo + chunk] = (v[i_lo] + v[i_hi]) / 2.0
    return out


def _median_per_step(s: StepSample) -> FloatArray:
    with np.errstate(all="ignore"):
        return np.asarray(np.nanmedian(np.where(s.present, s.step_time, np.nan), axis=1))


@dataclass(frozen=True)
class _Metric:
    stat: Stat
    per_step: PerStep
    better: str  # "lower" | "higher"
    column: str  # StepSample field that must hold data


_METRICS: dict[str, _Metric] = {
    "step_time_s": _Metric(_median_stat, _median_per_step, "lower", "step_time"),
    "tokens_per_s": _Metric(*_throughput("tokens"), "higher", "tokens"),
    "samples_per_s": _Metric(*_throughput("samples"), "higher", "samples"),
    "mfu": _Metric(*_throughput("tokens"), "higher", "tokens"),
    "comm_exposed_frac": _Metric(*_share("comm_exposed"), "lower", "comm_exposed"),
    "data_wait_frac": _Metric(*_share("data_wait"), "lower", "data_wait"),
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


def _bootstrap(stat: Stat, s: StepSample, n_boot: int, seed: int, which: int) -> FloatArray:
    """``n_boot`` replicates of ``stat`` over the units of ``s``, in bounded-memory chunks.

    Every metric of a run draws from the same stream (seed, run), so the metrics of one
    replicate come from the same resampled units and results repeat exactly.
    """
    rng = np.random.default_rng([seed, which])
    chunk = max(1, _CHUNK_FLOATS // max(1, s.step_time.size))
    parts = []
    for lo in range(0, n_boot, chunk):
        parts.append(stat(s, _weights(rng, s.n_steps, min(chunk, n_boot - lo))))
    return np.concatenate(parts)


def _split_half_rel(s: StepSample, stat: Stat) -> float:
    """Drift: the metric on the first half of the steps vs the second, relative."""
    n = s.n_steps
    if n < 4:
        return math.inf
    w = np.zeros((2, n))
    w[0, : n // 2] = 1.0
    w[1, n // 2:] = 1.0
    h = stat(s, w)
    mean = float(np.mean(h))
    return abs(float(h[0] - h[1])) / abs(mean) if mean else math.inf


def _spread_rel(s: StepSample, per_step: PerStep) -> float:
    """Robust step-to-step spread of the metric: 1.4826 x MAD / median of per-step values."""
    if s.n_steps < 4:
        return math.inf
    v = per_step(s)
    v = v[np.isfinite(v)]
    if not v.size:
        return math.inf
    med = float(np.median(v))
    return _MAD_SIGMA * float(np.median(np.abs(v - med))) / abs(med) if med else math.inf


def _has(s: StepSample, col: str) -> bool:
    return s.n_steps > 0 and bool(np.any(getattr(s, col) > 0))


def _judge(m: SpeedMetric, ci_rel: tuple[float, float], noise: float) -> str:
    assert m.diff_rel is not None
    if not (ci_rel[0] > 0 or ci_rel[1] < 0) or abs(m.diff_rel) <= noise:
        return "no significant difference"
    up = m.diff_rel > 0
    return "better" if up == (m.better == "higher") else "worse"


def _metric(name: str, sa: StepSample, sb: StepSample, n_boot: int, seed: int,
            min_effect_rel: float) -> SpeedMetric:
    spec = _METRICS[name]
    stat = spec.stat
    m = SpeedMetric(name, None, None, spec.better)
    if not (_has(sa, spec.column) and _has(sb, spec.column)):
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
    boot_a = _bootstrap(stat, sa.blocked(MAX_BOOT_UNITS), n_boot, seed, 0) * scale_a
    boot_b = _bootstrap(stat, sb.blocked(MAX_BOOT_UNITS), n_boot, seed, 1) * scale_b
    ok = np.isfinite(boot_a) & np.isfinite(boot_b) & (boot_a != 0)
    tail = (1.0 - CI_LEVEL) / 2 * 100
    d = np.percentile(boot_b[ok] - boot_a[ok], [tail, 100 - tail])
    r = np.percentile(boot_b[ok] / boot_a[ok] - 1.0, [tail, 100 - tail])
    m.ci, m.ci_rel = (float(d[0]), float(d[1])), (float(r[0]), float(r[1]))
    noise = max(_split_half_rel(sa, stat), _split_half_rel(sb, stat),
                _spread_rel(sa, spec.per_step), _spread_rel(sb, spec.per_step), min_effect_rel)
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
        for name in _METRICS:
            metrics[name] = _metric(name, sa, sb, n_boot, seed, min_effect_rel)
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
