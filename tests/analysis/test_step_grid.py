"""The rank x step grid gives the charts exactly what their general paths give (bit for bit),
on complete tables, tables with missing rows, uneven ranks, gaps in the steps and NaNs; and
tables that are not a grid (a repeated (rank, step) pair, rows out of order, steps too
sparse) take the general path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from stepscope import RunDir, RunMeta
from stepscope.analysis.fleet import fleet_matrix, slowest_ranks
from stepscope.analysis.series import by_step, phase_stack, rank_heatmap, series_doc, step_series
from stepscope.analysis.step_grid import general_path, step_grid
from stepscope.analysis.summary import summarize
from stepscope.schema import AnyArray, StepTable

# The sheet's summary of +-inf values warns; the values are there to be left out.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

_COLS = ("step_time_s", "tokens", "loss", "lr", "data_wait_s", "forward_s", "backward_s",
         "mem_peak_bytes")


def _table(ranks: list[int], steps: AnyArray, seed: int, drop: float = 0.0,
           only: dict[int, slice] | None = None) -> StepTable:
    """Every rank at ``steps`` (``only``: a rank at a part of them), ``drop`` of the rows
    left out at random; NaN, +-inf and -0.0 here and there; the lowest rank's loss has
    gaps."""
    rng = np.random.default_rng(seed)
    r_parts, s_parts = [], []
    for r in ranks:
        at = steps[only[r]] if only and r in only else steps
        r_parts.append(np.full(len(at), r))
        s_parts.append(at)
    r, s = np.concatenate(r_parts), np.concatenate(s_parts)
    keep = rng.random(len(r)) >= drop
    r, s = r[keep], s[keep]
    n = len(r)
    cols: dict[str, Any] = {"rank": r, "step": s}
    for i, c in enumerate(_COLS):
        v = rng.gamma(2.0, 0.1 + i, n)
        v[rng.random(n) < 0.05] = np.nan
        v[rng.integers(0, n, 3)] = np.inf
        v[rng.integers(0, n, 2)] = -np.inf
        cols[c] = v
    low = r == min(ranks)
    cols["loss"][low & (rng.random(n) < 0.2)] = np.nan
    cols["loss"][np.flatnonzero(low)[:3]] = -0.0
    cols["mem_peak_bytes"][r != max(ranks)] = np.nan  # one rank records memory
    return StepTable.from_columns(cols)


def _same(a: Any, b: Any, where: str) -> None:
    """Equal bit for bit (arrays: dtype, shape and bytes; NaN where NaN)."""
    if isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype and a.shape == b.shape, where
        assert np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes(), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            _same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    elif isinstance(a, float):
        assert isinstance(b, float) and orjson.dumps(a) == orjson.dumps(b) \
            and (a == b or (a != a and b != b)), where
    else:
        assert a == b, where


def _charts(table: StepTable) -> dict[str, Any]:
    out: dict[str, Any] = {"series": step_series(table), "phases": phase_stack(table)}
    for col in _COLS:
        for how in ("max", "sum", "mean", "first"):
            out[f"{col}/{how}"] = by_step(table, col, how)
    hm = rank_heatmap(table, "step_time_s", max_cols=37)
    out["heatmap"] = (hm.ranks, hm.bin_start_steps, hm.values, hm.median)
    for bins in (600, 7):
        m = fleet_matrix(table, "step_time_s", max_bins=bins)
        out[f"fleet/{bins}"] = (m.ranks, m.steps, m.values, slowest_ranks(m, 3))
    meta = RunMeta(run_id="grid", status="finished")
    out["doc"] = series_doc("grid", table, summarize(table, meta), meta, max_points=50,
                            heat_cols=23)
    return out


def _check_both_ways(table: StepTable) -> None:
    fast = _charts(table)
    with general_path():
        assert step_grid(table) is None
        general = _charts(table)
    _same(fast, general, "charts")


GRIDS = {
    "complete": lambda: _table(list(range(8)), np.arange(300), 1),
    "missing rows": lambda: _table([0, 2, 3, 9], np.arange(1000, 1400), 2, drop=0.1),
    "uneven ranks": lambda: _table([0, 1, 2, 5], np.arange(500), 3,
                                   only={1: slice(0, 250), 5: slice(120, 500)}),
    "gaps in the steps": lambda: _table([0, 1, 2], np.arange(0, 5000, 10), 4, drop=0.05),
    "one rank": lambda: _table([3], np.arange(200), 5, drop=0.1),
}


@pytest.mark.parametrize("name", list(GRIDS))
def test_the_grid_gives_what_the_general_path_gives(name: str) -> None:
    table = GRIDS[name]()
    grid = step_grid(table)
    assert grid is not None
    assert (grid.pos is None) == (name in ("complete", "one rank"))  # every pair there
    _check_both_ways(table)


def test_a_repeated_rank_step_pair_takes_the_general_path() -> None:
    base = _table([0, 1], np.arange(50), 6)
    twice = np.sort(np.concatenate([np.arange(len(base)), [10]]))  # row 10 twice: (0, 10)
    table = base.select(twice)
    assert step_grid(table) is None
    _check_both_ways(table)
    t = np.asarray(table["step_time_s"])
    steps, worst = by_step(table, "step_time_s", "max")
    at10 = t[(table["rank"] == 1) & (table["step"] == 10) | (np.arange(len(t)) == 10)]
    assert worst[list(steps).index(10)] == np.max(at10[np.isfinite(at10)])


def test_rows_out_of_order_or_too_sparse_steps_have_no_grid() -> None:
    base = _table([0, 1, 2], np.arange(40), 7)
    shuffled = base.select(np.random.default_rng(0).permutation(len(base)))
    assert step_grid(shuffled) is None
    _check_both_ways(shuffled)
    # 100 ranks, each at 10 steps of its own: 100,000 cells for 1,000 rows.
    own = StepTable.from_columns({"rank": np.repeat(np.arange(100), 10),
                                  "step": (np.arange(100)[:, None] * 100
                                           + np.arange(10)).ravel(),
                                  "step_time_s": np.linspace(0.1, 1.0, 1000)})
    assert step_grid(own) is None
    _check_both_ways(own)


def test_a_cached_runs_table_is_a_grid_and_its_charts_equal_the_general_path(
        tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", RunMeta(run_id="cached"))
    for r in range(4):
        lines = [orjson.dumps({"rank": r, "step": i, "step_time_s": 0.5 + (i * r % 7) / 10,
                               "tokens": 512.0, "loss": 4.0 - i / 100,
                               "forward_s": 0.1, "backward_s": 0.2})
                 for i in range(120) if (r, i) != (2, 33)]  # rank 2 lost a step
        run.steps_path(r).write_bytes(b"\n".join(lines) + b"\n")
    run.read_steps()  # builds the step cache
    table, _ = run.read_steps()  # from it: columns read when first used
    assert step_grid(table) is not None
    _check_both_ways(table)
