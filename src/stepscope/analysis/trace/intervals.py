"""Interval-set arithmetic on numpy arrays (the engine of every trace breakdown).

An interval set is a pair ``(starts, ends)`` of float64 arrays. ``union`` returns the
canonical form (sorted, disjoint, non-touching); the other functions take canonical sets.
Everything is vectorised: cost is one sort, no Python loop over intervals.

Example::

    import numpy as np
    a = union(np.array([0., 5., 2.]), np.array([3., 6., 4.]))   # ([0, 5], [4, 6])
    total(a)                                                    # 5.0
    total(intersect(a, (np.array([3.]), np.array([5.5]))))      # 1.5
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["Intervals", "EMPTY", "union", "total", "intersect", "subtract", "clip",
           "union_of"]

FloatArray = npt.NDArray[np.float64]
Intervals = tuple[FloatArray, FloatArray]
EMPTY: Intervals = (np.zeros(0), np.zeros(0))


def union(starts: npt.ArrayLike, ends: npt.ArrayLike) -> Intervals:
    """Merge possibly overlapping intervals; empty and inverted ones are dropped."""
    s = np.asarray(starts, dtype=np.float64)
    e = np.asarray(ends, dtype=np.float64)
    keep = e > s
    if not keep.all():
        s, e = s[keep], e[keep]
    if not len(s):
        return EMPTY
    order = np.argsort(s, kind="stable")
    s, e = s[order], e[order]
    run_max = np.maximum.accumulate(e)
    # A new group starts where an interval begins after everything before it has ended.
    new = np.empty(len(s), dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_max[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], run_max[last]


def union_of(*sets: Intervals) -> Intervals:
    """Union of several interval sets."""
    if not sets:
        return EMPTY
    return union(np.concatenate([s for s, _ in sets]), np.concatenate([e for _, e in sets]))


def total(iv: Intervals) -> float:
    """Covered length of a canonical set."""
    return float(np.sum(iv[1] - iv[0])) if len(iv[0]) else 0.0


def _sweep(a: Intervals, b: Intervals, want: int) -> Intervals:
    """Segments where the coverage level (a counts 1, b counts 2) equals ``want``."""
    if not len(a[0]) and not len(b[0]):
        return EMPTY
    t = np.concatenate([a[0], a[1], b[0], b[1]])
    w = np.concatenate([np.ones(len(a[0])), -np.ones(len(a[1])),
                        np.full(len(b[0]), 2.0), np.full(len(b[1]), -2.0)])
    order = np.lexsort((w, t))  # at equal times, ends (negative) first: touching != overlap
    t, level = t[order], np.cumsum(w[order])
    seg = (level[:-1] == want) & (t[1:] > t[:-1])
    return union(t[:-1][seg], t[1:][seg])


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Intersection of two canonical sets."""
    if not len(a[0]) or not len(b[0]):
        return EMPTY
    return _sweep(a, b, 3)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """``a`` minus ``b`` for canonical sets."""
    if not len(a[0]) or not len(b[0]):
        return a
    return _sweep(a, b, 1)


def clip(iv: Intervals, lo: float, hi: float) -> Intervals:
    """The part of a canonical set inside ``[lo, hi)``."""
    s, e = iv
    if not len(s):
        return EMPTY
    i = int(np.searchsorted(e, lo, side="right"))
    j = int(np.searchsorted(s, hi, side="left"))
    if i >= j:
        return EMPTY
    return np.maximum(s[i:j], lo), np.minimum(e[i:j], hi)
