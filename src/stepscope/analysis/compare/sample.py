"""Which steps a speed comparison uses, and the speed metrics computed over them.

Which steps count: the steady-state steps of ``summary.steady_mask`` (warm-up excluded),
minus outlier steps (a step whose slowest rank has a modified z-score of step time above
3.5; Iglewicz & Hoaglin, "How to Detect and Handle Outliers", 1993; when more than half
the steps are identical, MAD is 0 and 1.2533 x the mean absolute deviation stands in).
Both exclusions are counted, never silent.

The metrics use the formulas of ``summary.summarize`` (one definition of tokens/s, MFU and
shares for every report): throughput is sum(tokens)/sum(step_time_s) per rank, summed over
ranks; a share is sum(phase time)/sum(step time) over all rows; step time is the median of
all rows. Each metric is a function of unit weights (how often each step, or block of
steps, was drawn), so the point value (all weights 1), bootstrap replicates and split
halves share one implementation.

Example::

    sample = step_sample(table, meta)
    METRICS["tokens_per_s"].stat(sample, np.ones((1, sample.n_steps)))   # [tokens/s]
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from ..._fastnp import is_ordered, unique_ints
from ...schema import RunMeta, StepTable
from ..mfu import run_mfu
from ..summary import Conditions, headline_mask, steady_mask, throughput

__all__ = ["StepSample", "step_sample", "MetricSpec", "METRICS", "Stat", "PerStep",
           "split_half_rel", "spread_rel", "OUTLIER_Z", "CHUNK_FLOATS", "FloatArray",
           "shared_products"]

# Modified z-score above which a step is an outlier (Iglewicz & Hoaglin 1993, sec. 3.2).
OUTLIER_Z = 3.5
# 0.6745 = the 0.75 quantile of the standard normal: makes MAD a consistent sigma estimate
# (sigma = MAD / 0.6745 = 1.4826 x MAD for normal data).
_MAD_Z = 0.6745
_MAD_SIGMA = 1.0 / _MAD_Z
# When MAD is 0, sigma = 1.2533 x mean absolute deviation (sqrt(pi/2), the normal-data
# ratio of sigma to the mean absolute deviation), the usual fallback of the modified z.
_MEANAD_SIGMA = 1.2533
# Above this many rows (steps x ranks), the median bootstrap works on per-unit quantile
# summaries of the rows instead of every row (stepscope's bound: ~1 s for 2000 replicates).
_EXACT_MEDIAN_ROWS = 50_000
# Bound on floats held at once by one chunk of bootstrap replicates.
CHUNK_FLOATS = 4_000_000

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
    rows_unit: npt.NDArray[np.signedinteger[Any]]  # int32 unless 2**31 units or more
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
        # By unit, then value: the rows are already in value order, so a stable sort by
        # unit alone is lexsort((value, unit)); a radix sort when units fit 16 bits (always
        # after ``blocked``), O(rows) instead of a lexsort of every row.
        unit = self.rows_unit.astype(np.int16) if n_units <= np.iinfo(np.int16).max \
            else self.rows_unit
        order = np.argsort(unit, kind="stable")
        count = np.bincount(self.rows_unit, minlength=n_units)
        start = np.concatenate(([0], np.cumsum(count)[:-1]))
        has = np.flatnonzero(count)
        pos = start[has, None] + ((np.arange(k) + 0.5) * count[has, None] / k).astype(np.int64)
        vals = self.rows_sorted[order][pos].ravel()
        units = np.repeat(has, k)
        # Each of a unit's k rows stands for count/k rows; the weight kept is the count
        # itself (k times that, for every row alike, which moves no median). Integers keep
        # every sum of weights exact, so any order of summation finds the same median.
        weight = np.repeat(count[has], k).astype(np.float64)
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


class _Cells:
    """Where each row goes in the (steps x ranks) matrices: cell (step_pos, rank_pos).

    A matrix is filled in the rows' own order, as (ranks x steps), then transposed once:
    the rows come by rank, then step (the store's order), so the writes are sequential,
    where a scatter straight into (steps x ranks) put each value a row of the matrix away
    from the last (~80 ms a column at 1,024 ranks x 2,000 steps, 5 columns a run). When
    every cell has its row, in that order, the rows are the matrix as they stand. Values,
    and the last row's value in a cell given twice, are the scatter's."""

    def __init__(self, step_pos: npt.NDArray[np.int64], rank_pos: npt.NDArray[np.int64],
                 shape: tuple[int, int]) -> None:
        self.shape = shape
        whole = rank_pos.size == shape[0] * shape[1] and is_ordered(rank_pos, step_pos,
                                                                    strict=True)
        self.flat = None if whole else rank_pos * shape[0] + step_pos

    def _by_step(self, by_rank: npt.NDArray[Any]) -> npt.NDArray[Any]:
        n_steps, n_ranks = self.shape
        return np.ascontiguousarray(by_rank.reshape(n_ranks, n_steps).T)

    def matrix(self, vals: FloatArray) -> FloatArray:
        """``vals`` (one per row, non-finite as 0) in their cells; 0 where no row."""
        v = np.where(np.isfinite(vals), vals, 0.0)
        if self.flat is None:
            return self._by_step(v)
        by_rank = np.zeros(self.shape[0] * self.shape[1])
        by_rank[self.flat] = v
        return self._by_step(by_rank)

    def present(self) -> npt.NDArray[np.bool_]:
        """True in the cells a row fills."""
        if self.flat is None:
            return np.ones(self.shape, dtype=bool)
        by_rank = np.zeros(self.shape[0] * self.shape[1], dtype=bool)
        by_rank[self.flat] = True
        return self._by_step(by_rank)


def _sheet_factors(table: StepTable, head: npt.NDArray[np.bool_], meta: RunMeta | None
                   ) -> tuple[float | None, float | None]:
    """(MFU / tokens/s, memory peak) of ``summarize``'s sheet, by its own functions over
    the same rows (throughput of the headline rows, ``run_mfu``, the largest finite peak)
    without the rest of the sheet: at 9.6 million rows the whole sheet held ~1 GB more
    than the sample it was asked for."""
    steady = table.select(head) if head.any() else table
    tps = throughput(steady, "tokens")
    sps = throughput(steady, "samples")
    del steady
    mfu = run_mfu(tps, meta, len(table.ranks()), samples_per_s=sps)[0]
    mem = table["mem_peak_bytes"] if len(table) else np.array([])
    mem = mem[np.isfinite(mem)]
    return (mfu / tps if mfu and tps else None), (float(mem.max()) if mem.size else None)


def step_sample(table: StepTable, meta: RunMeta | None = None,
                conditions: Conditions | None = None) -> StepSample:
    """Steady-state, outlier-free steps of one run (pure; the table is not modified):
    the headline steps of ``summary.headline_mask`` (the steady-state regime).

    Built one column at a time (each matrix is made, cut to the kept steps, and the rows
    it came from let go): at 9.6 million rows a column is 77 MB."""
    mask = steady_mask(table)
    head, _ = headline_mask(table, conditions)
    factor, mem_peak = _sheet_factors(table, head, meta)
    idx = np.flatnonzero(head) if head.any() else np.arange(len(table))
    idx = idx[np.isfinite(table["step_time_s"][idx])]
    steps, step_pos = unique_ints(table["step"][idx], return_inverse=True)
    ranks, rank_pos = unique_ints(table["rank"][idx], return_inverse=True)
    cells = _Cells(step_pos, rank_pos, (len(steps), len(ranks)))
    t = cells.matrix(table["step_time_s"][idx])
    present = cells.present()
    out = _outlier_steps(t.max(axis=1)) if len(steps) else present[:, 0]
    keep = ~out
    every = bool(keep.all())
    if not every:
        t, present = t[keep], present[keep]
    cols: dict[str, FloatArray] = {}
    for c in ("tokens", "samples", "data_wait_s", "comm_exposed_s"):
        m = cells.matrix(table[c][idx])
        cols[c] = m if every else m[keep]
        del m  # the uncut matrix goes before the next one is made
    p = present
    unit = np.nonzero(p)[0]
    vals = t[p]
    # Any order of equal values will do: every median over these rows (weighted, thinned)
    # lands in a run of equal values by the weight before and within it, whatever order
    # the run is in. Not stable: 0.18 s for 2 million rows instead of 0.39.
    order = np.argsort(vals)
    # Unit indices fit 32 bits (a run of 2**31 steps is not one sample); the weight of
    # every row is 1, one shared value, until ``_thinned`` gives rows their own.
    unit_dtype = np.int32 if cells.shape[0] <= np.iinfo(np.int32).max else np.int64
    return StepSample(
        step_time=t, tokens=cols["tokens"], samples=cols["samples"],
        data_wait=cols["data_wait_s"], comm_exposed=cols["comm_exposed_s"], present=p,
        rows_sorted=vals[order], rows_unit=unit[order].astype(unit_dtype),
        rows_weight=np.broadcast_to(np.float64(1.0), order.shape),
        warmup_rows=int(len(table) - mask.sum()) if mask.any() else 0,
        outlier_steps=int(out.sum()), mfu_per_token_s=factor,
        mem_peak_bytes=mem_peak,
    )


# -- statistics over unit weights --------------------------------------------------------
# Each statistic maps (sample, weights) -> one value per replicate, where ``weights`` is a
# (replicates x units) matrix of how often each unit was drawn (all ones: the point value).
Stat = Callable[[StepSample, FloatArray], FloatArray]
# Each per-step function gives the metric of every single step (for the spread).
PerStep = Callable[[StepSample], FloatArray]


class _Products:
    """``weights @ matrix`` of registered weight matrices, each pair computed once. The
    weights and matrices are held here, so the ids that key them cannot be reused."""

    def __init__(self, weights: Sequence[FloatArray]) -> None:
        self.weights = {id(w): w for w in weights}
        self.done: dict[tuple[int, int], tuple[FloatArray, FloatArray]] = {}


_PRODUCTS: contextvars.ContextVar[_Products | None] = \
    contextvars.ContextVar("stepscope_compare_products", default=None)


@contextlib.contextmanager
def shared_products(weights: Sequence[FloatArray]) -> Iterator[None]:
    """Within the block, ``w @ matrix`` for each ``w`` of ``weights`` is computed once per
    matrix and reused: the metrics of one ledger draw the same replicate weights per run,
    and tokens/s, MFU and samples/s all divide by the same resampled step time (the
    largest cost at 1,024 ranks). Other weights (point values, split halves) are not kept."""
    token = _PRODUCTS.set(_Products(weights))
    try:
        yield
    finally:
        _PRODUCTS.reset(token)


def _dot(w: FloatArray, m: FloatArray) -> FloatArray:
    memo = _PRODUCTS.get()
    if memo is None or memo.weights.get(id(w)) is not w:
        return np.asarray(w @ m)
    key = (id(w), id(m))
    hit = memo.done.get(key)
    if hit is None or hit[0] is not m:
        hit = memo.done[key] = (m, np.asarray(w @ m))
    return hit[1]


def _throughput(col: str) -> tuple[Stat, PerStep]:
    def ratio(num: FloatArray, den: FloatArray) -> FloatArray:
        with np.errstate(divide="ignore", invalid="ignore"):
            total = np.where(den > 0, num / den, 0.0).sum(axis=-1)
        return np.asarray(np.where(total > 0, total, np.nan))

    def stat(s: StepSample, w: FloatArray) -> FloatArray:
        return ratio(_dot(w, getattr(s, col)), _dot(w, s.step_time))

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
    if v.size and w.shape[1] * _n_blocks(v.size) <= CHUNK_FLOATS:
        return _median_checkpointed(s, w)
    return _median_scan(s, w)


def _n_blocks(n_rows: int) -> int:
    return -(-n_rows // max(1, math.isqrt(n_rows)))


def _median_checkpointed(s: StepSample, w: FloatArray) -> FloatArray:
    """``_median_scan``'s medians from checkpoints: the sorted rows cut into about
    sqrt(rows) blocks, each block's weight per replicate from one product (replicates x
    units) @ (units x blocks), and only the block where the cumulative weight crosses half
    scanned row by row. At 1,024 ranks (50,000 rows, 2,000 replicates) that replaces 10^8
    gathered weights with one small matrix product and 2 x 2,000 x 224.

    Exactly ``_median_scan``'s result: bootstrap counts and row weights are integers, so
    every partial sum is an exact float and the order of summation cannot move a
    crossing."""
    v, unit = s.rows_sorted, s.rows_unit
    n = v.size
    size = max(1, math.isqrt(n))
    nb = _n_blocks(n)
    row_w = np.broadcast_to(s.rows_weight, (n,))
    block = np.arange(n) // size
    per_block = np.bincount(unit.astype(np.int64) * nb + block, weights=row_w,
                            minlength=w.shape[1] * nb).reshape(w.shape[1], nb)
    cum = np.cumsum(w @ per_block, axis=1)  # (replicates x blocks): weight up to each end
    half = cum[:, -1] / 2.0
    reps = np.arange(w.shape[0])
    offs = np.arange(size)
    found = []
    for crossed in (np.greater_equal, np.greater):  # the lower and the upper middle row
        b = np.argmax(crossed(cum, half[:, None]), axis=1)
        before = np.where(b > 0, cum[reps, b - 1], 0.0)
        # The last block may be short: its row index is clipped, and the repeats only add
        # weight after the crossing, which lies among the block's real rows.
        rows = np.minimum(b[:, None] * size + offs, n - 1)
        run = before[:, None] + np.cumsum(w[reps[:, None], unit[rows]] * row_w[rows], axis=1)
        found.append(b * size + np.argmax(crossed(run, half[:, None]), axis=1))
    return np.asarray((v[found[0]] + v[found[1]]) / 2.0)


def _median_scan(s: StepSample, w: FloatArray) -> FloatArray:
    """The weighted medians by a cumulative sum over every row, per replicate."""
    v = s.rows_sorted
    out = np.empty(w.shape[0])
    chunk = max(1, CHUNK_FLOATS // max(1, v.size))
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
class MetricSpec:
    """A speed metric: its statistic, per-step form, better direction, needed column."""

    stat: Stat
    per_step: PerStep
    better: str  # "lower" | "higher"
    column: str  # StepSample field that must hold data


METRICS: dict[str, MetricSpec] = {
    "step_time_s": MetricSpec(_median_stat, _median_per_step, "lower", "step_time"),
    "tokens_per_s": MetricSpec(*_throughput("tokens"), "higher", "tokens"),
    "samples_per_s": MetricSpec(*_throughput("samples"), "higher", "samples"),
    "mfu": MetricSpec(*_throughput("tokens"), "higher", "tokens"),
    "comm_exposed_frac": MetricSpec(*_share("comm_exposed"), "lower", "comm_exposed"),
    "data_wait_frac": MetricSpec(*_share("data_wait"), "lower", "data_wait"),
}


def split_half_rel(s: StepSample, stat: Stat) -> float:
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


def spread_rel(s: StepSample, per_step: PerStep) -> float:
    """Robust step-to-step spread of the metric: 1.4826 x MAD / median of per-step values."""
    if s.n_steps < 4:
        return math.inf
    v = per_step(s)
    v = v[np.isfinite(v)]
    if not v.size:
        return math.inf
    med = float(np.median(v))
    return _MAD_SIGMA * float(np.median(np.abs(v - med))) / abs(med) if med else math.inf
