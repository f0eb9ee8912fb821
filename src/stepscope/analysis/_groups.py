"""Rows grouped by rank without one full-table mask per rank (the sheet's per-rank sums),
and :func:`median_by`, the median of each group of an inverse index (the per-step medians
over ranks of a table that is no rank x step grid).

Its own module because four analyses group the same way: the sheet (``summary``), the
regimes' per-step series (``regimes``) and the rank and system health rules
(``health.ranks``, ``health.system``); each would otherwise import another for it.

Example::

    g = Groups.of(table["rank"], within=table["step"])
    g.sums(table["tokens"])       # one nansum per rank, in rank order
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .._fastnp import is_ordered
from ..schema import AnyArray

__all__ = ["Groups", "median_by"]


@dataclass(frozen=True)
class Groups:
    """Rows grouped by rank, each group in table order (a stable sort): ``order[starts[g]:
    starts[g] + counts[g]]`` are the rows of rank ``ranks[g]``. One sort replaces one
    full-table mask per rank (O(ranks x rows)). Sums stay ``np.sum`` of each rank's slice
    (pairwise summation): ``np.add.reduceat`` sums sequentially and would move the last
    bits of every share, so the one loop left is over slices, O(rows) in all."""

    ranks: AnyArray
    order: AnyArray
    starts: AnyArray
    counts: AnyArray
    identity: bool = False  # ``order`` is 0..n-1: columns are used as they are, not copied

    @classmethod
    def of(cls, rank: AnyArray, within: AnyArray | None = None) -> Groups:
        order, identity = _stable_order(rank, within)
        r = rank if identity else rank[order]
        starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]]) if r.size else r[:0]
        counts = np.diff(np.r_[starts, r.size])
        return cls(r[starts], order, starts, counts, identity)

    def _ordered(self, x: AnyArray) -> AnyArray:
        return x if self.identity else x[self.order]

    def _slices(self) -> list[tuple[int, int]]:
        return list(zip(self.starts.tolist(), self.counts.tolist(), strict=True))

    def gid(self) -> AnyArray:
        """Group index of each position of ``order``."""
        return np.repeat(np.arange(self.ranks.size), self.counts)

    def sums(self, x: AnyArray) -> AnyArray:
        """np.nansum of each group (0.0 for none)."""
        if not x.size:
            return np.zeros(self.ranks.size)
        v = self._ordered(x)  # per slice: no full-table temporaries (10 M rows: 77 MB each)
        return np.array([np.where(np.isnan(p), 0.0, p).sum()
                         for p in (v[a:a + n] for a, n in self._slices())], dtype=np.float64)

    def finite_sums(self, x: AnyArray) -> AnyArray:
        """Sum of each group's finite values, as ``x[np.isfinite(x)].sum()`` (0.0 for none)."""
        v = self._ordered(x)
        out = np.zeros(self.ranks.size)
        for i, (a, n) in enumerate(self._slices()):
            part = v[a:a + n]
            out[i] = part[np.isfinite(part)].sum()  # the same contiguous values as before
        return out

    def any_finite(self, x: AnyArray) -> AnyArray:
        if not x.size:
            return np.zeros(self.ranks.size, dtype=bool)
        return np.logical_or.reduceat(np.isfinite(self._ordered(x)), self.starts)

    def medians(self, x: AnyArray, skip_first: bool = False) -> AnyArray:
        """np.median of each group's finite values (optionally without its first row).

        A loop over contiguous slices (O(rows) in all): ``np.median`` of each is exactly
        the per-rank value, and cheaper than sorting the whole table by (rank, value)."""
        v = self._ordered(x)
        out = np.full(self.ranks.size, np.nan)
        skip = int(skip_first)
        width = int(self.counts[0]) if self.counts.size else 0
        if width > skip and bool((self.counts == width).all()):
            grid = v.reshape(self.ranks.size, width)[:, skip:]
            if bool(np.isfinite(grid).all()):  # equal groups, all finite: one call
                return np.asarray(np.median(grid, axis=1))
        for i, (a, n) in enumerate(zip(self.starts.tolist(), self.counts.tolist(),
                                       strict=True)):
            part = v[a + skip:a + n]
            part = part[np.isfinite(part)]
            if part.size:
                out[i] = np.median(part)
        return out


def _stable_order(rank: AnyArray, within: AnyArray | None) -> tuple[AnyArray, bool]:
    """Stable order by rank (then ``within``), and whether it is the identity (the rows
    already are in that order)."""
    if is_ordered(rank, within):
        return np.arange(rank.size), True
    if within is None:
        return np.argsort(rank, kind="stable"), False
    return np.lexsort((within, rank)), False


# median_by's (steps x ranks) grid is used while it holds at most this many cells per row
# (plus a constant): ranks that recorded different steps leave holes in it.
_GRID_PER_ROW = 4
_GRID_SLACK = 1 << 16


def median_by(v: AnyArray, inv: AnyArray, n: int, slot: AnyArray | None = None
               ) -> AnyArray:
    """Median of the finite ``v`` of each group ``inv`` (0..n-1), NaN for empty groups;
    no loop over groups (a run may have 1000 ranks x 100k steps).

    ``slot`` (e.g. each row's rank index): when every (group, slot) pair occurs at most
    once and the (groups x slots) grid is not much larger than the rows, the values are
    placed in that grid and each row of it sorted (small sorts); otherwise one sort of
    all rows by (group, value). Both take the same middle values."""
    out = np.full(n, np.nan)
    ok = np.isfinite(v)
    if not ok.any():
        return out
    g, x = inv[ok], v[ok]
    width = int(slot.max()) + 1 if slot is not None and slot.size else 0
    if slot is not None and n * width <= _GRID_PER_ROW * v.size + _GRID_SLACK:
        cells = g * width + slot[ok]
        if int(np.bincount(cells, minlength=n * width).max()) <= 1:
            grid = np.full(n * width, np.nan)
            grid[cells] = x
            del cells, x  # 10 M rows: each of these is 77 MB
            grid = grid.reshape(n, width)
            counts = np.bincount(g, minlength=n)
            if bool((counts == width).all()):  # every cell finite: the two middles only
                mid = np.partition(grid, ((width - 1) // 2, width // 2), axis=1)
                out[:] = (mid[:, (width - 1) // 2] + mid[:, width // 2]) / 2.0
                return out
            grid.sort(axis=1)  # in place; NaN sorts last
            rows = np.flatnonzero(counts)
            c = counts[rows]
            out[rows] = (grid[rows, (c - 1) // 2] + grid[rows, c // 2]) / 2.0
            return out
    order = np.lexsort((x, g))
    g, x = g[order], x[order]
    counts = np.bincount(g, minlength=n)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    has = counts > 0
    lo = starts[has] + (counts[has] - 1) // 2
    hi = starts[has] + counts[has] // 2
    out[has] = (x[lo] + x[hi]) / 2.0
    return out
