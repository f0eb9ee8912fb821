"""Ranks drawn as a fleet: median and quantile bands, the slowest ranks named, a heatmap.

One line per rank is unreadable past ~8 ranks and makes a 1,024-rank SVG of megabytes. Here
a column becomes a rank x step-bin matrix (mean of each rank's steps in each bin, one
``np.bincount`` pass, no loop per rank or record); plots draw the median over ranks, the
10-90% band and the min-max band, the slowest ranks as named lines, and the whole matrix
as a heatmap of each rank's step time over the median of its step bin.

Example::

    m = fleet_matrix(table, "step_time_s")
    svg = fleet_svgs(table)               # list of SVG strings for the HTML report
"""

from __future__ import annotations

import io
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..schema import AnyArray, StepTable

__all__ = ["FleetMatrix", "fleet_matrix", "slowest_ranks", "fleet_svgs", "MAX_BINS"]

# Step bins per plot: ~2 per horizontal pixel of a 5-inch SVG figure; more only adds bytes.
MAX_BINS = 600
# Ranks named as lines on the step-time plot (more would be the spaghetti this replaces).
SLOWEST_SHOWN = 3
_CURVES = (("loss", "training loss"), ("step_time_s", "step time (s)"),
           ("lr", "learning rate"), ("grad_norm", "gradient norm"),
           ("mem_peak_bytes", "memory peak (bytes)"), ("loss_scale", "loss scale"))


@dataclass(frozen=True)
class FleetMatrix:
    """``values[i, j]``: mean of rank ``ranks[i]``'s finite values in step bin ``j``
    (NaN when it has none); bin ``j`` starts at step ``steps[j]``."""

    ranks: AnyArray
    steps: AnyArray
    values: AnyArray

    def quantiles(self, qs: tuple[float, ...]) -> AnyArray:
        """Rows: the ``qs`` percentiles over ranks of each step bin (NaN where none)."""
        with warnings.catch_warnings():
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


def _dense_ids(x: AnyArray) -> tuple[AnyArray, AnyArray]:
    """(sorted distinct values, index of each value): ``np.unique(return_inverse)``, in
    O(n) with a lookup table when the values are small non-negative integers (ranks, steps)."""
    if x.size and x.min() >= 0 and x.max() < 4 * x.size + 4096:
        present = np.bincount(x) > 0
        values = np.flatnonzero(present)
        lookup = np.cumsum(present) - 1
        return values, lookup[x]
    values, inverse = np.unique(x, return_inverse=True)
    return values, inverse


def _bins(table: StepTable, max_bins: int) -> _Bins:
    ranks, row = _dense_ids(table["rank"])
    steps, si = _dense_ids(table["step"])
    nb = max(1, min(len(steps), max_bins))
    first = np.searchsorted(np.arange(len(steps)) * nb // max(1, len(steps)), np.arange(nb))
    return _Bins(ranks, row, steps[first] if len(steps) else steps,
                 si * nb // max(1, len(steps)), nb)


def fleet_matrix(table: StepTable, col: str, max_bins: int = MAX_BINS,
                 bins: _Bins | None = None) -> FleetMatrix:
    """The rank x step-bin matrix of ``col`` (see :class:`FleetMatrix`)."""
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


def _svg(fig: Any) -> str:
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _curve(plt: Any, m: FleetMatrix, col: str, label: str) -> str:
    fig, ax = plt.subplots(figsize=(5.2, 2.8))
    x = m.steps
    if len(m.ranks) == 1:
        ax.plot(x, m.values[0], lw=1, color="#1f77b4")
    else:
        lo, p10, med, p90, hi = m.quantiles((0, 10, 50, 90, 100))
        ax.fill_between(x, lo, hi, color="#1f77b4", alpha=.12, lw=0, label="min-max")
        ax.fill_between(x, p10, p90, color="#1f77b4", alpha=.3, lw=0, label="10-90%")
        ax.plot(x, med, lw=1, color="#1f77b4", label=f"median of {len(m.ranks)} ranks")
        if col == "step_time_s":
            index = {int(r): i for i, r in enumerate(m.ranks)}
            for (rank, ratio), colour in zip(slowest_ranks(m), ("#d62728", "#ff7f0e",
                                                                  "#9467bd"), strict=False):
                ax.plot(x, m.values[index[rank]], lw=.8, color=colour,
                        label=f"rank {rank} ({ratio:.2f}x median)")
        ax.legend(fontsize=7)
    ax.set_xlabel("step")
    ax.set_title(label, fontsize=10)
    ax.grid(alpha=.3)
    return _svg(fig)


def _heatmap(plt: Any, m: FleetMatrix) -> str:
    """Each rank's step time over the median of its step bin: stragglers are bright rows."""
    med = m.quantiles((50,))[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = m.values / np.where(med > 0, med, np.nan)[None, :]
    finite = ratio[np.isfinite(ratio)]
    hi = max(1.05, float(np.percentile(finite, 99.5))) if finite.size else 2.0
    fig, ax = plt.subplots(figsize=(10.6, min(7.0, 1.6 + 0.02 * len(m.ranks))))
    x0, x1 = (float(m.steps[0]), float(m.steps[-1]) + 1) if len(m.steps) else (0.0, 1.0)
    img = ax.imshow(ratio, aspect="auto", interpolation="nearest", cmap="magma",
                    vmin=min(0.95, 2 - hi), vmax=hi, origin="lower",
                    extent=(x0, x1, -0.5, len(m.ranks) - 0.5))
    ticks = np.linspace(0, len(m.ranks) - 1, min(len(m.ranks), 9)).round().astype(int)
    ax.set_yticks(ticks, [str(int(m.ranks[t])) for t in ticks])
    ax.set_xlabel("step")
    ax.set_ylabel("rank")
    ax.set_title("step time / median of the step's ranks (rank x step)", fontsize=10)
    fig.colorbar(img, ax=ax, fraction=.03, pad=.01)
    return _svg(fig)


def fleet_svgs(table: StepTable) -> tuple[list[str], list[str]]:
    """(curve plots, wide plots) as SVG strings: one per recorded curve, and the heatmap
    when more than one rank recorded step times."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves, wide = [], []
    bins = _bins(table, MAX_BINS)
    for col, label in _CURVES:
        if table.has_data(col):
            m = fleet_matrix(table, col, bins=bins)
            curves.append(_curve(plt, m, col, label))
            if col == "step_time_s" and len(m.ranks) > 1:
                wide.append(_heatmap(plt, m))
    return curves, wide
