"""Ranks as a fleet: quantile bands over ranks and the slowest ranks named.

One line per rank is unreadable past ~8 ranks. Here a column becomes a rank x step-bin
matrix (mean of each rank's steps in each bin, one ``np.bincount`` pass, no loop per rank
or record); the run page (``serve_data.series_doc``'s ``fleet``) draws the median over
ranks, the 10-90% and min-max bands, and names the slowest ranks beside its heatmap.

Example::

    m = fleet_matrix(table, "step_time_s")
    m.quantiles((10, 50, 90))             # rows: 10%, median, 90% over ranks per bin
    slowest_ranks(m, 3)                   # [(700, 1.31), ...]
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np

from .._fastnp import unique_ints
from ..schema import AnyArray, StepTable
from .step_grid import StepGrid, step_grid

__all__ = ["FleetMatrix", "fleet_matrix", "slowest_ranks", "MAX_BINS"]

# Step bins: about one per horizontal pixel of a chart; more only adds bytes.
MAX_BINS = 600
# Ranks named by default (more would be the spaghetti this replaces).
SLOWEST_SHOWN = 3


@dataclass(frozen=True)
class FleetMatrix:
    """``values[i, j]``: mean of rank ``ranks[i]``'s finite values in step bin ``j``
    (NaN when it has none); bin ``j`` starts at step ``steps[j]``."""

    ranks: AnyArray
    steps: AnyArray
    values: AnyArray

    def quantiles(self, qs: tuple[float, ...]) -> AnyArray:
        """Rows: the ``qs`` percentiles over ranks of each step bin (NaN where none)."""
        if np.isfinite(self.values).all():  # the common case: one vectorised pass
            return np.asarray(np.percentile(self.values, qs, axis=0))
        with warnings.catch_warnings():  # nanpercentile loops over columns in Python
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN bins stay NaN
            return np.asarray(np.nanpercentile(self.values, qs, axis=0))


@dataclass(frozen=True)
class _Bins:
    """Where each row goes: its rank's row and its step's bin (computed once per table)."""

    ranks: AnyArray
    row: AnyArray
    steps: AnyArray
    bin: AnyArray
    nb: int


def _bins(table: StepTable, max_bins: int) -> _Bins:
    ranks, row = unique_ints(table["rank"], return_inverse=True)
    steps, si = unique_ints(table["step"], return_inverse=True)
    nb = max(1, min(len(steps), max_bins))
    first = np.searchsorted(np.arange(len(steps)) * nb // max(1, len(steps)), np.arange(nb))
    return _Bins(ranks, row, steps[first] if len(steps) else steps,
                 si * nb // max(1, len(steps)), nb)


def _grid_matrix(grid: StepGrid, values: AnyArray, max_bins: int) -> FleetMatrix:
    """:func:`fleet_matrix` on the step grid: one ``bincount`` per rank's row, which adds
    each cell's values in step order from 0.0 as the whole table's ``bincount`` does."""
    n_steps = len(grid.steps)
    nb = max(1, min(n_steps, max_bins))
    bin_of = np.arange(n_steps) * nb // n_steps
    first = np.searchsorted(bin_of, np.arange(nb))
    every = np.bincount(bin_of, minlength=nb)
    out = np.empty((len(grid.ranks), nb))
    for i, row in enumerate(grid.frame(values)):
        ok = np.isfinite(row)
        if ok.all():
            sums, counts = np.bincount(bin_of, weights=row, minlength=nb), every
        else:
            sums = np.bincount(bin_of[ok], weights=row[ok], minlength=nb)
            counts = np.bincount(bin_of[ok], minlength=nb)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[i] = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return FleetMatrix(grid.ranks, grid.steps[first], out)


def fleet_matrix(table: StepTable, col: str, max_bins: int = MAX_BINS,
                 bins: _Bins | None = None) -> FleetMatrix:
    """The rank x step-bin matrix of ``col`` (see :class:`FleetMatrix`)."""
    grid = step_grid(table) if bins is None and len(table) else None
    if grid is not None:
        return _grid_matrix(grid, table[col], max_bins)
    b = bins if bins is not None else _bins(table, max_bins)
    v = table[col]
    ok = np.isfinite(v)
    flat = b.row[ok] * b.nb + b.bin[ok]
    size = len(b.ranks) * b.nb
    sums = np.bincount(flat, weights=v[ok], minlength=size)
    counts = np.bincount(flat, minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):
        values = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return FleetMatrix(b.ranks, b.steps, values.reshape(-1, b.nb))


def slowest_ranks(m: FleetMatrix, n: int = SLOWEST_SHOWN) -> list[tuple[int, float]]:
    """(rank, its median over step bins / the fleet's median) of the ``n`` slowest ranks."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        per_rank = np.nanmedian(m.values, axis=1)
    fleet = float(np.nanmedian(per_rank)) if np.isfinite(per_rank).any() else np.nan
    if not np.isfinite(fleet) or fleet <= 0:
        return []
    order = np.argsort(-np.nan_to_num(per_rank, nan=-np.inf), kind="stable")[:n]
    return [(int(m.ranks[i]), float(per_rank[i] / fleet)) for i in order
            if np.isfinite(per_rank[i])]
