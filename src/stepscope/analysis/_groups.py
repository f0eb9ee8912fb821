"""Rows grouped by rank without one full-table mask per rank (the sheet's per-rank sums).

Moved out of ``summary.py`` unchanged (that module was at the house's size limit).

Example::

    g = Groups.of(table["rank"], within=table["step"])
    g.sums(table["tokens"])       # one nansum per rank, in rank order
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..schema import AnyArray

__all__ = ["Groups"]


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

    @classmethod
    def of(cls, rank: AnyArray, within: AnyArray | None = None) -> Groups:
        order = _stable_order(rank, within)
        r = rank[order]
        starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]]) if r.size else r[:0]
        counts = np.diff(np.r_[starts, r.size])
        return cls(r[starts], order, starts, counts)

    def gid(self) -> AnyArray:
        """Group index of each position of ``order``."""
        return np.repeat(np.arange(self.ranks.size), self.counts)

    def sums(self, x: AnyArray) -> AnyArray:
        """np.nansum of each group (0.0 for none)."""
        if not x.size:
            return np.zeros(self.ranks.size)
        v = x[self.order]
        return self._slice_sums(np.where(np.isnan(v), 0.0, v), self.starts, self.counts)

    @staticmethod
    def _slice_sums(v: AnyArray, starts: AnyArray, counts: AnyArray) -> AnyArray:
        return np.array([v[a:a + n].sum() for a, n in zip(starts.tolist(), counts.tolist(),
                                                          strict=True)], dtype=np.float64)

    def finite_sums(self, x: AnyArray) -> AnyArray:
        """Sum of each group's finite values, as ``x[np.isfinite(x)].sum()`` (0.0 for none)."""
        v = x[self.order]
        ok = np.isfinite(v)
        out = np.zeros(self.ranks.size)
        gid = self.gid()[ok]
        if gid.size:
            first = np.flatnonzero(np.r_[True, gid[1:] != gid[:-1]])
            out[gid[first]] = self._slice_sums(v[ok], first, np.diff(np.r_[first, gid.size]))
        return out

    def any_finite(self, x: AnyArray) -> AnyArray:
        if not x.size:
            return np.zeros(self.ranks.size, dtype=bool)
        return np.logical_or.reduceat(np.isfinite(x[self.order]), self.starts)

    def medians(self, x: AnyArray, skip_first: bool = False) -> AnyArray:
        """np.median of each group's finite values (optionally without its first row).

        A loop over contiguous slices (O(rows) in all): ``np.median`` of each is exactly
        the per-rank value, and cheaper than sorting the whole table by (rank, value)."""
        v = x[self.order]
        out = np.full(self.ranks.size, np.nan)
        skip = int(skip_first)
        for i, (a, n) in enumerate(zip(self.starts.tolist(), self.counts.tolist(),
                                       strict=True)):
            part = v[a + skip:a + n]
            part = part[np.isfinite(part)]
            if part.size:
                out[i] = np.median(part)
        return out


def _stable_order(rank: AnyArray, within: AnyArray | None) -> AnyArray:
    """Stable order by rank (then ``within``); the identity when the rows already are."""
    order: AnyArray
    if rank.size < 2:
        return np.arange(rank.size)
    dr = np.diff(rank)
    if within is None:
        order = np.arange(rank.size) if bool((dr >= 0).all()) else np.argsort(
            rank, kind="stable")
        return order
    if bool(((dr > 0) | ((dr == 0) & (np.diff(within) >= 0))).all()):
        return np.arange(rank.size)
    order = np.lexsort((within, rank))
    return order
