"""Robust statistics shared by the health rules: median/MAD, trailing windows, runs, splits.

Pure numpy; every function takes arrays and returns new arrays or numbers.

Example::

    z = trailing_robust_z(np.array([1.0] * 20 + [5.0]), window=16, min_periods=8)
    z[-1] > 6    # True: a 6-sigma jump over the trailing window
"""

from __future__ import annotations

import weakref

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..._fastnp import is_ordered, unique_ints
from ...schema import AnyArray, StepTable

__all__ = [
    "MAD_TO_SIGMA", "robust_sigma", "trailing_median", "trailing_robust_z", "runs_of",
    "spearman", "average_ranks", "theil_sen_slope", "best_split", "rank_series",
    "first_rank_with", "quarter_medians", "rank_values", "split_medians_bound", "by_rank",
]

# For normally distributed data, sigma = 1.4826 x MAD (1 / Phi^-1(3/4)).
MAD_TO_SIGMA = 1.4826


def robust_sigma(x: AnyArray) -> float:
    """1.4826 x median absolute deviation of the finite values (0.0 when none)."""
    x = x[np.isfinite(x)]
    if not x.size:
        return 0.0
    return float(MAD_TO_SIGMA * np.median(np.abs(x - np.median(x))))


def _windows(x: AnyArray, window: int) -> AnyArray:
    """Row i holds the ``window`` values strictly before i (NaN-padded at the start)."""
    pad = np.concatenate([np.full(window, np.nan), x[:-1]]) if x.size else x
    return sliding_window_view(pad, window) if x.size else np.empty((0, window))


def _row_medians(w: AnyArray, full: AnyArray) -> AnyArray:
    """``np.nanmedian(w, axis=1)``: rows marked ``full`` (every value finite) by
    ``np.median``'s partition, the rest (the window start, gaps) by ``np.nanmedian``.
    Both take the same middle values; the masked sort of ``nanmedian`` costs ~10x more."""
    out = np.empty(w.shape[0])
    if full.any():
        out[full] = np.median(w[full], axis=1)
    if not full.all():
        out[~full] = np.nanmedian(w[~full], axis=1)
    return out


# Windows are copied this many rows at a time: a 150,000-step series with a 128-step window
# is a 154 MB matrix per copy, and the median and MAD each made a few.
_ROWS_PER_CHUNK = 8192


def _chunks(rows: AnyArray) -> list[AnyArray]:
    return [rows[i:i + _ROWS_PER_CHUNK] for i in range(0, rows.size, _ROWS_PER_CHUNK)]


def trailing_median(x: AnyArray, window: int, min_periods: int) -> AnyArray:
    """Median of the finite values among the ``window`` values before each position."""
    w = _windows(x, window)
    out = np.full(x.shape, np.nan)
    if not x.size:
        return out
    count = np.isfinite(w).sum(axis=1)
    for rows in _chunks(np.flatnonzero(count >= min_periods)):
        out[rows] = _row_medians(w[rows], count[rows] == window)
    return out


def trailing_robust_z(x: AnyArray, window: int, min_periods: int,
                      rel_floor: float = 0.01) -> AnyArray:
    """Robust z-score of each value against the trailing window (non-finite excluded).

    z_i = (x_i - median_w) / max(1.4826 MAD_w, rel_floor |median_w|); NaN where the window
    holds fewer than ``min_periods`` finite values or x_i itself is not finite.
    """
    w = _windows(x, window)
    z = np.full(x.shape, np.nan)
    if not x.size:
        return z
    count = np.isfinite(w).sum(axis=1)
    ok = (count >= min_periods) & np.isfinite(x)
    if not ok.any():
        return z
    for rows in _chunks(np.flatnonzero(ok)):  # row by row: the same values as all at once
        sub, full = w[rows], count[rows] == window
        med = _row_medians(sub, full)
        mad = _row_medians(np.abs(sub - med[:, None]), full)
        scale = np.maximum(MAD_TO_SIGMA * mad, rel_floor * np.abs(med))
        scale = np.where(scale > 0, scale, np.finfo(float).tiny)
        z[rows] = (x[rows] - med) / scale
    return z


def runs_of(mask: AnyArray) -> list[tuple[int, int]]:
    """Index ranges ``(first, last)`` (inclusive) of consecutive True values."""
    if not mask.size:
        return []
    m = np.concatenate([[False], mask.astype(bool), [False]])
    d = np.diff(m.astype(np.int8))
    starts = np.flatnonzero(d == 1)
    ends = np.flatnonzero(d == -1) - 1
    return [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]


def average_ranks(v: AnyArray) -> AnyArray:
    """Ranks 0..n-1 of ``v``, ties sharing their average rank (a flat stretch of a
    high-water mark is one value, not an ascending run)."""
    order = np.argsort(v, kind="mergesort")
    _, first, counts = np.unique(v[order], return_index=True, return_counts=True)
    ranks = np.empty(v.size)
    ranks[order] = np.repeat(first + (counts - 1) / 2.0, counts)
    return ranks


def spearman(x: AnyArray, y: AnyArray) -> float:
    """Spearman rank correlation, ties at their average rank (0.0 when undefined)."""
    ok = np.isfinite(x) & np.isfinite(y)
    if ok.sum() < 3:
        return 0.0
    rx, ry = average_ranks(x[ok]), average_ranks(y[ok])
    if rx.std() == 0 or ry.std() == 0:
        return 0.0
    return float(np.corrcoef(rx, ry)[0, 1])


def theil_sen_slope(x: AnyArray, y: AnyArray, max_points: int = 256) -> float:
    """Theil-Sen slope (Sen 1968): the median of the slopes between all pairs of points,
    robust to up to ~29% outliers; NaN with fewer than two points. Longer series are
    thinned evenly to ``max_points`` first (the pairs grow as n squared)."""
    ok = np.isfinite(x) & np.isfinite(y)
    x, y = x[ok], y[ok]
    if x.size > max_points:
        keep = np.linspace(0, x.size - 1, max_points).round().astype(int)
        x, y = x[keep], y[keep]
    i, j = np.triu_indices(x.size, k=1)
    dx = x[j] - x[i]
    good = dx != 0
    if not good.any():
        return float("nan")
    return float(np.median((y[j] - y[i])[good] / dx[good]))


def best_split(y: AnyArray, min_segment: int, max_points: int = 400) -> int | None:
    """Index that best splits ``y`` into two segments of different medians.

    Minimises the summed absolute deviation from each segment's median (an L1 single
    changepoint, robust to outlier steps). Long series are first reduced to block medians
    of ``max_points`` blocks, so cost stays O(max_points^2). None if ``y`` is too short.
    """
    y = y[np.isfinite(y)]
    n = y.size
    if n < 2 * min_segment:
        return None
    block = max(1, int(np.ceil(n / max_points)))
    m = n // block
    pts = np.median(y[: m * block].reshape(m, block), axis=1) if block > 1 else y
    seg = max(1, min_segment // block)
    ks = np.arange(seg, pts.size - seg + 1)
    if not ks.size:
        return None
    cost = _l1_costs(pts, ks, left=True) + _l1_costs(pts, ks, left=False)
    # L1 costs tie exactly more often than one would think (flat stretches), and the
    # vectorised sums round differently in the last bits: re-cost the near-minimal splits
    # the way the scalar loop did, so the first minimal split is the one always chosen.
    near = ks[cost <= cost.min() + 1e-9 * max(1.0, abs(float(cost.min())))]
    best, best_k = np.inf, int(near[0])
    for k in near.tolist():
        left, right = pts[:k], pts[k:]
        c = np.abs(left - np.median(left)).sum() + np.abs(right - np.median(right)).sum()
        if c < best:
            best, best_k = c, k
    return best_k * block


def _l1_costs(pts: AnyArray, ks: AnyArray, left: bool) -> AnyArray:
    """sum |x - median(x)| over x = pts[:k] (or pts[k:]) for every k in ``ks``, at once.

    Row i of a (len(ks), len(pts)) matrix holds the segment of split ks[i]; the median of a
    segment of length n is the middle (or mean of the two middle) of its sorted values, as
    ``np.median`` computes it. O(P^2) memory for P <= ``max_points`` points: ~1 MB.
    """
    idx = np.arange(pts.size)
    inside = idx[None, :] < ks[:, None] if left else idx[None, :] >= ks[:, None]
    n = inside.sum(axis=1)
    # Values outside the segment sort after it (+inf), so its sorted values come first.
    ordered = np.sort(np.where(inside, pts[None, :], np.inf), axis=1)
    rows = np.arange(ks.size)
    med = (ordered[rows, (n - 1) // 2] + ordered[rows, n // 2]) / 2
    dev = np.where(inside, np.abs(pts[None, :] - med[:, None]), 0.0)
    costs: AnyArray = dev.sum(axis=1)
    return costs


# id(rank array) -> (weak ref to it, ranks, positions ordered by (rank, step), bounds,
# whether those positions are 0..n-1: the table was ordered already).
# Rules call rank_series once per rank and column; finding a rank's rows with ``rank == r``
# each time cost O(ranks x rows) per column (minutes at 1,024 ranks). Arrays are not
# hashable, so the key is the id and the weak reference both checks it and drops the entry
# when the table's column goes away.
_ORDER_CACHE: dict[int, tuple[weakref.ref[AnyArray], AnyArray, AnyArray, AnyArray, bool]] = {}


def _rank_order(table: StepTable) -> tuple[AnyArray, AnyArray, AnyArray, bool]:
    rank = table["rank"]
    key = id(rank)
    hit = _ORDER_CACHE.get(key)
    if hit is not None and hit[0]() is rank:
        return hit[1], hit[2], hit[3], hit[4]
    ordered = is_ordered(rank, table["step"])
    order = (np.arange(rank.size) if ordered
             else np.lexsort((table["step"], rank)))  # stable: ties keep table order
    ranks, starts = unique_ints(rank if ordered else rank[order], return_index=True)
    bounds = np.r_[starts, rank.size]
    ref = weakref.ref(rank, lambda _: _ORDER_CACHE.pop(key, None))
    _ORDER_CACHE[key] = (ref, ranks, order, bounds, ordered)
    return ranks, order, bounds, ordered


def rank_series(table: StepTable, rank: int, col: str) -> tuple[AnyArray, AnyArray]:
    """(steps, values) of one rank and column, ordered by step (read-only: in a table
    already ordered by (rank, step), views of its columns, not copies)."""
    ranks, order, bounds, ordered = _rank_order(table)
    i = int(np.searchsorted(ranks, rank))
    if i >= ranks.size or ranks[i] != rank:
        idx = order[:0]
    else:
        a, b = int(bounds[i]), int(bounds[i + 1])
        if ordered:  # ~21 -> ~3 us a call: the rules make ~13,000 of them at 1,024 ranks
            return _view(table["step"], a, b), _view(table[col], a, b)
        idx = order[a:b]
    return table["step"][idx], table[col][idx]


def by_rank(table: StepTable, *cols: str) -> tuple[AnyArray, AnyArray, list[AnyArray]]:
    """(ranks, bounds, columns): ``cols`` with their rows in (rank, step) order, rank
    ``ranks[i]`` at ``bounds[i]:bounds[i + 1]`` (the table's own columns when it is in that
    order already). The rows :func:`rank_series` gives, for all ranks at once."""
    ranks, order, bounds, ordered = _rank_order(table)
    return ranks, bounds, [table[c] if ordered else table[c][order] for c in cols]


def _view(col: AnyArray, a: int, b: int) -> AnyArray:
    v = col[a:b]
    v.flags.writeable = False
    return v


def rank_values(table: StepTable, values: AnyArray) -> dict[int, AnyArray]:
    """``values`` (one per row of ``table``) split by rank, each ordered by step: what
    ``{r: values[table["rank"] == r] for r in table.ranks()}`` gives up to order, in one
    pass instead of one scan of the table per rank (2 G comparisons at 1,024 ranks)."""
    ranks, order, bounds, _ = _rank_order(table)
    return {int(r): values[order[bounds[i]:bounds[i + 1]]] for i, r in enumerate(ranks.tolist())}


def split_medians_bound(y: AnyArray, min_segment: int, max_points: int = 400
                        ) -> tuple[float, float]:
    """(lowest, highest) median any segment :func:`best_split` can return may have.

    Its segments hold at least L = max(1, min_segment // block) x block values of the
    finite ``y`` (block as there); the median of L or more of ``y``'s values is at least
    ``y``'s ((L - 1) // 2)-th smallest value and at most its ((L - 1) // 2)-th largest, the
    float mean of two such values included. A rule can skip the split when even these
    bounds could not show the drop it looks for. (NaN, NaN) when ``y`` is too short.
    """
    y = y[np.isfinite(y)]
    n = y.size
    if n < 2 * min_segment:
        return float("nan"), float("nan")
    block = max(1, int(np.ceil(n / max_points)))
    j = (max(1, min_segment // block) * block - 1) // 2
    lo, hi = np.partition(y, (j, n - 1 - j))[[j, n - 1 - j]]
    return float(lo), float(hi)


def first_rank_with(table: StepTable, col: str) -> int | None:
    """Lowest rank holding at least one finite value in ``col``."""
    if not table.has_data(col):
        return None
    ok = np.isfinite(table[col])
    return int(table["rank"][ok].min())


def quarter_medians(y: AnyArray) -> tuple[float, float]:
    """Median of the first and of the last quarter of the finite values."""
    y = y[np.isfinite(y)]
    q = max(1, y.size // 4)
    return float(np.median(y[:q])), float(np.median(y[-q:]))
