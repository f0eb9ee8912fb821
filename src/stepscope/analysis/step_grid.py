"""A step table as a rank x step grid, when it is one: the charts' reductions without a sort.

The store's tables are ordered by (rank, step) with no repeated pair, and in most runs every
rank records every step. Such a table's column is then a (ranks x steps) matrix as it
stands (``reshape``, no copy), and "the slowest rank's step time at each step" is a
reduction along the rank axis: no ``unique`` with an inverse over every row, no
``ufunc.at``, no 8-bytes-a-row temporaries (on a 1,000,000-step x 8-rank run those took
most of the run page's first paint). A table with missing rows still is a grid when it
has at most twice as many cells as rows: its values are scattered once into a NaN-filled
matrix. Any other table (rows out of order, a repeated (rank, step) pair, steps so sparse
the grid would be much larger) has no grid, and the callers take their general path.

The reductions give exactly what the general paths give: sums and means add each step's
values in rank order from 0.0 as ``np.bincount`` does, maxima go through ``np.maximum`` in
the same order as ``np.maximum.at``; only the sign of a zero maximum could differ.

Example::

    grid = step_grid(table)             # None: take the general path
    steps, t = grid.over_ranks(table["step_time_s"], "max")
    with general_path():                # the same charts the general way (to check one
        step_grid(table)                # against the other): None
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from .._fastnp import LastResult, is_ordered
from ..schema import AnyArray, StepTable

__all__ = ["StepGrid", "step_grid", "general_path", "MAX_CELLS_PER_ROW"]

# A table is drawn as a grid when the grid has at most this many cells per row (plus a
# constant): beyond it, missing rows would cost more memory than the general path.
MAX_CELLS_PER_ROW = 2
_CELL_SLACK = 4096


@dataclass(frozen=True)
class StepGrid:
    """``ranks`` and ``steps`` sorted; row ``i`` of the table is cell ``pos[i]`` of the
    flattened (ranks x steps) grid, or cell ``i`` when ``pos`` is None (every pair there)."""

    ranks: AnyArray
    steps: AnyArray
    pos: AnyArray | None

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.ranks), len(self.steps)

    def frame(self, values: AnyArray) -> AnyArray:
        """``values`` (one per row) as the (ranks x steps) grid, NaN where no row; a view of
        ``values`` when every pair is there (do not modify it)."""
        v = np.asarray(values, dtype=np.float64)
        if self.pos is None:
            return v.reshape(self.shape)
        out = np.full(self.shape[0] * self.shape[1], np.nan)
        out[self.pos] = v
        return out.reshape(self.shape)

    def over_ranks(self, values: AnyArray, how: str) -> tuple[AnyArray, AnyArray]:
        """``analysis.series.by_step`` on the grid: (steps, value per step) over ranks,
        ``max``, ``sum``, ``mean`` or ``first`` (the lowest rank), non-finite values left
        out, steps without any left out."""
        f = self.frame(values)
        if how == "first":
            row = f[0]
            ok = np.isfinite(row)
            return self.steps[ok], row[ok] + 0.0  # as bincount's sum from 0.0 (-0.0: 0.0)
        acc = np.full(len(self.steps), -np.inf) if how == "max" else np.zeros(len(self.steps))
        fill = -np.inf if how == "max" else 0.0
        whole = 0  # rows finite throughout; the others' finite values counted per step
        count = np.zeros(len(self.steps), dtype=np.int64)
        for row in f:  # in rank order, as bincount and maximum.at take the rows
            ok = np.isfinite(row)
            if ok.all():
                part, whole = row, whole + 1
            else:
                part = np.where(ok, row, fill)
                count += ok
            if how == "max":
                np.maximum(acc, part, out=acc)
            else:
                acc += part  # + 0.0 leaves a sum from 0.0 as it is
        count += whole
        if whole:  # every step has a value
            return self.steps, acc / count if how == "mean" else acc
        keep = count > 0
        return self.steps[keep], (acc[keep] / count[keep] if how == "mean" else acc[keep])

    def median_over_ranks(self, values: AnyArray) -> AnyArray | None:
        """Each step's median over ranks of ``values`` (one per row), when every rank has
        every step and every value is finite; else None (the caller's general path). The
        two middle order statistics of each step's values: what a sort of them takes."""
        if self.pos is not None:
            return None
        f = np.asarray(values, dtype=np.float64).reshape(self.shape)
        if not bool(np.isfinite(f).all()):
            return None
        width = self.shape[0]
        lo, hi = (width - 1) // 2, width // 2
        by_step = np.ascontiguousarray(f.T)  # steps x ranks: each step's values contiguous
        by_step.partition((lo, hi) if lo != hi else lo, axis=1)
        out: AnyArray = (by_step[:, lo] + by_step[:, hi]) / 2.0
        return out


def _build(table: StepTable) -> StepGrid | None:
    n = len(table)
    if n == 0 or table["rank"].dtype.kind not in "iu" or table["step"].dtype.kind not in "iu":
        return None
    rank, step = table["rank"], table["step"]
    if not is_ordered(rank, step, strict=True):
        return None
    starts = np.concatenate([[0], np.flatnonzero(rank[1:] != rank[:-1]) + 1, [n]])
    ranks = rank[starts[:-1]]
    lens = np.diff(starts)
    first = step[:lens[0]]
    if (lens == lens[0]).all() and all(np.array_equal(step[a:b], first) for a, b
                                       in zip(starts[1:-1], starts[2:], strict=True)):
        return StepGrid(ranks, first.copy(), None)  # every rank has the same steps
    lo, hi = int(step.min()), int(step.max())
    if len(ranks) * (hi - lo + 1) <= MAX_CELLS_PER_ROW * n + _CELL_SLACK:
        present = np.zeros(hi - lo + 1, dtype=bool)  # the steps: a presence table, no sort
        present[step - lo] = True
        steps = (np.flatnonzero(present) + lo).astype(step.dtype)
    else:
        steps = np.unique(step)
        if len(ranks) * len(steps) > MAX_CELLS_PER_ROW * n + _CELL_SLACK:
            return None
    pos = np.empty(n, dtype=np.intp)
    width = len(steps)
    for i, (a, b) in enumerate(zip(starts[:-1], starts[1:], strict=True)):
        pos[a:b] = np.searchsorted(steps, step[a:b]) + i * width
    return StepGrid(ranks, steps, pos)


_last = LastResult(_build)
_general = contextvars.ContextVar("stepscope_general_path", default=False)


def step_grid(table: StepTable) -> StepGrid | None:
    """The grid of ``table`` (see the module docstring), or None; the last table's grid is
    kept, so the several charts of one table find it once."""
    return None if _general.get() else _last((table,))


@contextlib.contextmanager
def general_path() -> Iterator[None]:
    """Within it (this thread), no table has a grid: every chart takes its general path."""
    token = _general.set(True)
    try:
        yield
    finally:
        _general.reset(token)
