"""Per-step series of a run, as trackers and the dashboard draw them (pure, numpy only).

One definition feeds every chart and export: the job's step time at a step is the slowest
rank's (the others wait for it at the next collective), the job's tokens/s is all ranks'
tokens over that step time, result-layer values (loss, lr, grad norm, loss scale) come from
the lowest rank, as a script that logs on rank 0 shows them.

Example::

    series = step_series(table)                # {"result/loss": (steps, values), ...}
    grid = rank_heatmap(table, "step_time_s", max_cols=600)
    steps, lo, hi = envelope(*series["efficiency/step_time_s"], max_points=2000)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._fastnp import unique_ints
from ..schema import AnyArray, RunMeta, StepTable
from .fleet import fleet_matrix, slowest_ranks
from .step_grid import step_grid
from .summary import Sheet

__all__ = ["series_doc", "SERIES", "MAX_RANK_SERIES", "step_series", "by_step", "envelope",
           "RankHeatmap", "rank_heatmap", "phase_stack", "PHASES"]

# Per-rank series are drawn for up to this many ranks; past it the heatmap is the view (a
# tracker would drown in thousands of series).
MAX_RANK_SERIES = 64
_GIB = float(1 << 30)

# (tag, column, how over ranks, scale)
SERIES: tuple[tuple[str, str, str, float], ...] = (
    ("result/loss", "loss", "first", 1.0),
    ("result/accuracy", "accuracy", "first", 1.0),
    ("train/lr", "lr", "first", 1.0),
    ("train/grad_norm", "grad_norm", "first", 1.0),
    ("train/loss_scale", "loss_scale", "first", 1.0),
    ("efficiency/step_time_s", "step_time_s", "max", 1.0),
    ("system/mem_peak_gib", "mem_peak_bytes", "max", 1.0 / _GIB),
    ("system/data_wait_s", "data_wait_s", "max", 1.0),
    ("system/comm_s", "comm_s", "max", 1.0),
)
# Phases of the stacked per-step breakdown; "other" is the step time none of them explains.
PHASES: tuple[str, ...] = ("data_wait_s", "forward_s", "backward_s", "optimizer_s",
                           "comm_exposed_s")


def by_step(table: StepTable, col: str, how: str) -> tuple[AnyArray, AnyArray]:
    """(steps, value per step) of ``col`` over ranks: ``max``, ``sum``, ``mean`` or
    ``first`` (the lowest rank). Non-finite values are left out."""
    grid = step_grid(table)
    if grid is not None:  # the store's tables: a reduction along the rank axis
        return grid.over_ranks(table[col], how)
    steps = table["step"]
    vals = table[col].astype(np.float64)
    keep = np.isfinite(vals)
    if how == "first" and len(table):
        keep &= table["rank"] == table["rank"].min()
    steps, vals = steps[keep], vals[keep]
    if not len(steps):
        return steps, vals
    uniq, inv = unique_ints(steps, return_inverse=True)
    out: AnyArray
    if how in ("first", "mean"):
        out = np.bincount(inv, weights=vals) / np.bincount(inv)
    elif how == "sum":
        out = np.bincount(inv, weights=vals)
    else:
        out = np.full(len(uniq), -np.inf)
        np.maximum.at(out, inv, vals)
    return uniq, out


def step_series(table: StepTable, per_rank: bool = True
                ) -> dict[str, tuple[AnyArray, AnyArray]]:
    """``tag -> (steps, values)`` for every series with data (see the module docstring);
    ``per_rank``: also each rank's step time (``ranks/RANK/step_time_s``) up to
    ``MAX_RANK_SERIES`` ranks."""
    out: dict[str, tuple[AnyArray, AnyArray]] = {}
    for tag, col, how, scale in SERIES:
        if table.has_data(col):
            steps, vals = by_step(table, col, how)
            if len(steps):
                out[tag] = (steps, vals * scale)
    lm = table.has_data("tokens") or not table.has_data("samples")  # samples only: images
    if "result/loss" in out and lm:
        steps, loss = out["result/loss"]
        ok = loss < 700  # exp() overflows float64 past ~709: no perplexity for such losses
        out["result/perplexity"] = (steps[ok], np.exp(loss[ok]))
    if table.has_data("tokens") and "efficiency/step_time_s" in out:
        t_steps, t = out["efficiency/step_time_s"]
        k_steps, tokens = by_step(table, "tokens", "sum")
        if np.array_equal(t_steps, k_steps):  # the usual case: no sort to intersect them
            ok = t > 0
            out["efficiency/tokens_per_s"] = (t_steps[ok], tokens[ok] / t[ok])
        else:
            common, ia, ib = np.intersect1d(t_steps, k_steps, return_indices=True)
            ok = t[ia] > 0
            out["efficiency/tokens_per_s"] = (common[ok], tokens[ib][ok] / t[ia][ok])
    if per_rank:
        out.update(_rank_series(table))
    return out


def _rank_series(table: StepTable) -> dict[str, tuple[AnyArray, AnyArray]]:
    out: dict[str, tuple[AnyArray, AnyArray]] = {}
    grid = step_grid(table)
    ranks = grid.ranks.tolist() if grid is not None else table.ranks()
    if not 1 < len(ranks) <= MAX_RANK_SERIES:
        return out
    if grid is not None:  # each rank's row of the grid
        for r, row in zip(ranks, grid.frame(table["step_time_s"]), strict=True):
            ok = np.isfinite(row)
            out[f"ranks/{r:05d}/step_time_s"] = (grid.steps[ok], row[ok])
        return out
    for r in ranks:
        part = table.rank(r)
        ok = np.isfinite(part["step_time_s"])
        out[f"ranks/{r:05d}/step_time_s"] = (part["step"][ok],
                                             part["step_time_s"][ok].astype(np.float64))
    return out


def envelope(steps: AnyArray, values: AnyArray, max_points: int
             ) -> tuple[AnyArray, AnyArray, AnyArray]:
    """Down-sample to at most ``max_points`` bins keeping each bin's min and max, so a
    one-step spike survives (reservoir sampling would drop it). Returns (first step of each
    bin, min, max); with few points, min = max = the values themselves."""
    n = len(steps)
    if n <= max_points:
        return steps, values, values
    edges = np.linspace(0, n, max_points + 1).astype(np.int64)
    starts = edges[:-1]
    lo = np.minimum.reduceat(values, starts)
    hi = np.maximum.reduceat(values, starts)
    return steps[starts], lo, hi


@dataclass
class RankHeatmap:
    """rank x step-bin grid of ``column`` (the bin's max, NaN where a rank has no step)."""

    column: str
    ranks: list[int]
    bin_start_steps: list[int]
    values: AnyArray  # shape (len(ranks), len(bin_start_steps))
    median: float  # over all cells, the colour scale's centre


def rank_heatmap(table: StepTable, column: str = "step_time_s", max_cols: int = 600
                 ) -> RankHeatmap:
    """The fleet view: one row per rank, steps binned to at most ``max_cols`` columns by the
    bin's maximum (a slow step stays visible), readable at 1,024 ranks."""
    sg = step_grid(table)
    ranks = sg.ranks.tolist() if sg is not None else table.ranks()
    if not len(table) or not table.has_data(column):
        return RankHeatmap(column, ranks, [], np.zeros((len(ranks), 0)), float("nan"))
    steps = sg.steps if sg is not None else table["step"]
    lo, hi = int(steps.min()), int(steps.max())
    width = max(1, -(-(hi - lo + 1) // max_cols))  # steps per column, rounded up
    cols = (hi - lo) // width + 1
    grid = np.full((len(ranks), cols), -np.inf)
    if sg is not None:  # each rank's row of the step grid, cut where the column changes
        col_of = (steps - lo) // width
        starts = np.concatenate([[0], np.flatnonzero(np.diff(col_of)) + 1])
        for i, row in enumerate(sg.frame(table[column])):
            ok = np.isfinite(row)
            part = row if ok.all() else np.where(ok, row, -np.inf)
            grid[i, col_of[starts]] = np.maximum.reduceat(part, starts)
    else:
        rows = np.searchsorted(np.asarray(ranks), table["rank"])  # ranks() is sorted
        vals = table[column].astype(np.float64)
        ok = np.isfinite(vals)
        np.maximum.at(grid, (rows[ok], ((steps[ok] - lo) // width).astype(np.int64)),
                      vals[ok])
    grid[np.isneginf(grid)] = np.nan
    med = float(np.nanmedian(grid)) if np.isfinite(grid).any() else float("nan")
    return RankHeatmap(column, ranks, [lo + i * width for i in range(cols)], grid, med)


def phase_stack(table: StepTable) -> tuple[AnyArray, dict[str, AnyArray]]:
    """Per step, the mean over ranks of each phase (seconds) and ``other`` (step time no
    phase explains, never negative), for the stacked breakdown chart."""
    steps, total = by_step(table, "step_time_s", "mean")
    out: dict[str, AnyArray] = {}
    explained = np.zeros(len(steps))
    for col in PHASES:
        if not table.has_data(col):
            continue
        s, v = by_step(table, col, "mean")
        if np.array_equal(s, steps):  # the usual case: the phase is at every step
            full = v
        else:  # a phase at a step without a step time is left out (it had been put at
            full = np.zeros(len(steps))  # the next step, or past the end: IndexError)
            idx = np.searchsorted(steps, s)
            hit = idx < len(steps)
            hit[hit] = steps[idx[hit]] == s[hit]
            full[idx[hit]] = v[hit]
        out[col] = full
        explained += full
    out["other_s"] = np.maximum(total - explained, 0.0)
    return steps, out


def _floats(a: AnyArray) -> list[float | None]:
    """JSON-ready floats, None where not finite (one tolist, then only the gaps patched)."""
    a = np.asarray(a, dtype=np.float64)
    out: list[float | None] = a.tolist()
    for i in np.flatnonzero(~np.isfinite(a)).tolist():
        out[i] = None
    return out


def series_doc(rel: str, table: StepTable, sheet: Sheet, meta: RunMeta, max_points: int = 2000,
               heat_cols: int = 600, steps: tuple[int, int | None] | None = None
               ) -> dict[str, Any]:
    """The chart document of one run (also embedded in the offline HTML report)."""
    if steps is not None:
        keep = table["step"] >= steps[0]
        if steps[1] is not None:
            keep &= table["step"] <= steps[1]
        table = table.select(keep)
    series = step_series(table, per_rank=False)  # ranks: the fleet's bands and the heatmap
    if sheet.mfu and sheet.tokens_per_s and "efficiency/tokens_per_s" in series:
        # MFU is proportional to tokens/s (MFU = tokens/s x FLOPs/token / (devices x
        # peak)): scaling by the sheet's own ratio keeps one definition of MFU.
        s, tps = series["efficiency/tokens_per_s"]
        series["efficiency/mfu"] = (s, tps * (sheet.mfu / sheet.tokens_per_s))
    out: dict[str, Any] = {}
    for tag, (at, vals) in series.items():
        s, lo, hi = envelope(at, vals, max_points)
        out[tag] = {"steps": s.tolist(), "lo": _floats(lo), "hi": _floats(hi)}
    phases, fleet = _phases(table, max_points), _fleet(table, heat_cols)
    drawn = [np.asarray(d["steps"], dtype=np.int64)
             for d in [*out.values(), phases, *([fleet] if fleet else [])]]
    return {"path": rel, "series": out, "x": _x_axes(table, series, drawn),
            "phases": phases, "heatmap": _heatmap(table, heat_cols), "fleet": fleet,
            "warmup_steps": sheet.warmup_steps, "status": meta.status,
            "window": list(steps) if steps else None}


def _x_axes(table: StepTable, series: dict[str, tuple[AnyArray, AnyArray]],
            drawn: Sequence[AnyArray]) -> dict[str, Any]:
    """Step -> cumulative tokens and -> wall time since the first step, for the x selector,
    at the ``drawn`` steps only (the charts' decimated points: not every step of a long
    run, which was most of its series document)."""
    at = np.unique(np.concatenate(drawn)) if drawn else np.zeros(0, dtype=np.int64)

    def axis(steps: AnyArray, total: AnyArray) -> dict[str, Any]:
        keep = np.isin(steps, at)
        return {"steps": steps[keep].tolist(), "value": total[keep].tolist()}

    out: dict[str, Any] = {}
    if "efficiency/step_time_s" in series:
        steps, t = series["efficiency/step_time_s"]
        out["wall_s"] = axis(steps, np.cumsum(t))
    if table.has_data("tokens"):
        steps, tokens = by_step(table, "tokens", "sum")
        out["tokens"] = axis(steps, np.cumsum(tokens))
    return out


def _phases(table: StepTable, max_points: int) -> dict[str, Any]:
    """The stacked phase split per step; past ``max_points`` steps, the mean of each bin of
    consecutive steps (means stack: the bins' parts still add up to their step time)."""
    steps, cols = phase_stack(table) if len(table) else (np.zeros(0, dtype=np.int64), {})
    n = len(steps)
    if n > max_points:
        b = np.arange(n) * max_points // n
        counts = np.bincount(b, minlength=max_points)
        starts = np.searchsorted(b, np.arange(max_points))
        steps = steps[starts]
        cols = {k: np.bincount(b, weights=v, minlength=max_points) / counts
                for k, v in cols.items()}
    return {"steps": steps.tolist(), "cols": {k: _floats(v) for k, v in cols.items()}}


def _heatmap(table: StepTable, cols: int) -> dict[str, Any]:
    grid = rank_heatmap(table, "step_time_s", cols)
    return {"column": grid.column, "ranks": grid.ranks, "steps": grid.bin_start_steps,
            "median": None if math.isnan(grid.median) else grid.median,
            "values": [_floats(row) for row in grid.values]}


# Ranks named as the slowest beside the fleet chart.
_SLOWEST_NAMED = 5


def _fleet(table: StepTable, cols: int) -> dict[str, Any] | None:
    """Step time across ranks per step bin: min, 10%, median, 90%, max over the ranks' bin
    means, and the slowest ranks (their median over the fleet's); None for one rank."""
    grid = step_grid(table)
    ranks = len(grid.ranks) if grid is not None else len(table.ranks()) if len(table) else 0
    if ranks < 2 or not table.has_data("step_time_s"):
        return None
    m = fleet_matrix(table, "step_time_s", max_bins=cols)
    q = m.quantiles((0.0, 10.0, 50.0, 90.0, 100.0))
    out: dict[str, Any] = {"ranks": int(m.ranks.size), "steps": m.steps.tolist()}
    for name, row in zip(("min", "p10", "median", "p90", "max"), q, strict=True):
        out[name] = _floats(row)
    out["slowest"] = [[r, x] for r, x in slowest_ranks(m, _SLOWEST_NAMED)]
    return out
