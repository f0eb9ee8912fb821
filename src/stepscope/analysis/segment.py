"""Segmentation of a step-time series into regimes (stretches at one speed), moved out of
:mod:`.regimes` unchanged (which re-exports it): binary segmentation (Scott & Knott 1974)
of log step time under a squared error cost, at most ``MAX_REGIMES`` regimes of at least
``MIN_REGIME_STEPS`` steps; a split is kept only when the two sides' mean log step times
differ by ``MIN_SHIFT`` and by ``SPLIT_Z`` x their standard errors.
"""

from __future__ import annotations

import math

import numpy as np

from ..schema import AnyArray

__all__ = ["segment", "MIN_SHIFT", "SPLIT_Z", "MIN_REGIME_STEPS", "MAX_REGIMES"]

# A regime's typical step time differs from its neighbour's by at least 20%: step times of
# one configuration on a shared 2-core host jitter by ~10% (measured on the demo), so 20%
# is a change of condition, not noise.
MIN_SHIFT = 0.20
# Split significance: the difference of mean log step times exceeds 5 standard errors.
SPLIT_Z = 5.0
MIN_REGIME_STEPS = 5
MAX_REGIMES = 4

# -- segmentation -------------------------------------------------------------------------
def _mean_se(x: AnyArray) -> float:
    return math.sqrt(float(np.var(x, ddof=1)) / x.size) if x.size > 1 else math.inf


def _best_cut(y: AnyArray, lo: int, hi: int, min_len: int) -> int | None:
    """Cut of y[lo:hi] minimising the two sides' squared error (prefix sums, O(n))."""
    seg = y[lo:hi]
    n = seg.size
    if n < 2 * min_len:
        return None
    c1, c2 = np.cumsum(seg), np.cumsum(seg * seg)
    k = np.arange(min_len, n - min_len + 1)
    left = c2[k - 1] - c1[k - 1] ** 2 / k
    right = (c2[-1] - c2[k - 1]) - (c1[-1] - c1[k - 1]) ** 2 / (n - k)
    return lo + int(k[int(np.argmin(left + right))])


def _significant(y: AnyArray, lo: int, cut: int, hi: int) -> bool:
    """Means of log step time (Welch's t): a median would split an alternating 0.08/0.12 s
    series anywhere, and a single stall inflates its own side's error, so it never splits."""
    a, b = y[lo:cut], y[cut:hi]
    shift = abs(float(np.mean(a) - np.mean(b)))
    return bool(shift >= math.log1p(MIN_SHIFT)
                and shift >= SPLIT_Z * math.hypot(_mean_se(a), _mean_se(b)))


def segment(step_time_s: AnyArray, min_len: int = MIN_REGIME_STEPS,
            max_regimes: int = MAX_REGIMES) -> list[tuple[int, int]]:
    """Index ranges ``[start, end)`` of regimes of a positive step-time series.

    Example: ``segment(np.r_[np.full(30, 3.0), np.full(30, 0.45)])`` -> ``[(0, 30), (30, 60)]``.
    """
    y = np.log(np.maximum(np.asarray(step_time_s, dtype=float), 1e-12))
    bounds = [0, y.size]
    while len(bounds) - 1 < max_regimes:
        best: tuple[float, int] | None = None
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            cut = _best_cut(y, lo, hi, min_len)
            if cut is None or not _significant(y, lo, cut, hi):
                continue
            gain = abs(float(np.mean(y[lo:cut]) - np.mean(y[cut:hi])))
            if best is None or gain > best[0]:
                best = (gain, cut)
        if best is None:
            break
        bounds = sorted([*bounds, best[1]])
    return list(zip(bounds[:-1], bounds[1:], strict=True))
