"""The O(rows) paths for runs of millions of records give what the sorting code gave, bit for bit.

Oracles are the previous implementations, inline: ``np.unique``, ``np.nanmedian`` over
every trailing window, a lexsort for per-step medians and for the first/last loss, a full
copy per ``select``, and a bootstrap that drew and blocked each metric on its own.
"""

from __future__ import annotations

import numpy as np
import pytest

from stepscope._fastnp import LastResult, is_ordered, unique_ints
from stepscope.analysis import regimes, summary
from stepscope.analysis._groups import median_by
from stepscope.analysis.compare import speed
from stepscope.analysis.compare.sample import CHUNK_FLOATS, METRICS, shared_products, step_sample
from stepscope.analysis.health import stats
from stepscope.analysis.step_grid import general_path, step_grid
from stepscope.schema import StepTable


def _np_unique(x: np.ndarray, **kw: bool) -> tuple[np.ndarray, ...]:
    out = np.unique(x, **kw)
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("seed", range(28))
def test_unique_ints_equals_np_unique(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3000))
    x = [rng.integers(-50, 50, n), rng.integers(0, 10**15, n), np.tile(np.arange(40), 9)[::-1],
         rng.integers(0, 3, n).astype(np.int32), rng.random(n),
         np.sort(rng.integers(-5, 60, n)), np.repeat(np.arange(4, dtype=np.uint16), 7),
         np.full(n, 9)][seed % 8]  # the last three sorted: runs, not a presence table
    for kw in ({}, {"return_inverse": True}, {"return_index": True},
               {"return_index": True, "return_inverse": True}):
        got = unique_ints(x, **kw)
        got = got if isinstance(got, tuple) else (got,)
        want = _np_unique(x, **kw)
        assert len(got) == len(want)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == w.dtype and np.array_equal(g, w)


def test_select_takes_columns_lazily_and_equals_a_copy() -> None:
    rng = np.random.default_rng(0)
    n = 500
    t = StepTable.from_columns({"rank": rng.integers(0, 4, n), "step": rng.integers(0, 90, n),
                                "step_time_s": rng.random(n), "my_metric": rng.random(n)})
    mask = rng.random(n) < 0.6
    sub = t.select(mask)
    again = sub.select(np.flatnonzero(sub["step_time_s"] > 0.3))
    for name in t.columns:
        want = t[name][mask]
        assert np.array_equal(sub[name], want, equal_nan=True)
        assert np.array_equal(again[name], t[name][mask][t["step_time_s"][mask] > 0.3],
                              equal_nan=True)
    assert sub["loss"].strides == (0,)  # never recorded: still one shared NaN
    assert len(sub) == int(mask.sum()) and sub.columns == t.columns
    with pytest.raises(IndexError):
        t.select(mask[:-1])
    ordered = t.sorted()
    assert is_ordered(ordered["rank"], ordered["step"])
    assert ordered.sorted() is ordered


def _window_nanmedian(x: np.ndarray, window: int, min_periods: int) -> np.ndarray:
    w = stats._windows(x, window)
    out = np.full(x.shape, np.nan)
    ok = np.isfinite(w).sum(axis=1) >= min_periods
    if ok.any():
        out[ok] = np.nanmedian(w[ok], axis=1)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_trailing_windows_equal_nanmedian_of_every_window(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, int(rng.integers(1, 2000)) if seed % 4 else 20_000)  # > a chunk
    if seed % 2:
        x[rng.random(x.size) < 0.05] = np.nan
    window, min_periods = [(16, 8), (128, 32), (64, 64)][seed % 3]
    assert np.array_equal(stats.trailing_median(x, window, min_periods),
                          _window_nanmedian(x, window, min_periods), equal_nan=True)
    w = stats._windows(x, window)
    count = np.isfinite(w).sum(axis=1)
    ok = (count >= min_periods) & np.isfinite(x)
    z = np.full(x.shape, np.nan)
    if ok.any():
        med = np.nanmedian(w[ok], axis=1)
        mad = np.nanmedian(np.abs(w[ok] - med[:, None]), axis=1)
        scale = np.maximum(stats.MAD_TO_SIGMA * mad, 0.01 * np.abs(med))
        z[ok] = (x[ok] - med) / np.where(scale > 0, scale, np.finfo(float).tiny)
    assert np.array_equal(stats.trailing_robust_z(x, window, min_periods), z, equal_nan=True)
    y = rng.normal(0, 1, x.size)
    # distinct values: average ranks are the ordinal ranks (ties: tests/alerts/test_memory_trend.py)
    assert np.array_equal(stats.average_ranks(y), np.argsort(np.argsort(y)).astype(float))


def _median_by_lexsort(v: np.ndarray, inv: np.ndarray, n: int) -> np.ndarray:
    out = np.full(n, np.nan)
    ok = np.isfinite(v)
    g, x = inv[ok], v[ok]
    order = np.lexsort((x, g))
    g, x = g[order], x[order]
    counts = np.bincount(g, minlength=n)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    has = counts > 0
    out[has] = (x[starts[has] + (counts[has] - 1) // 2] + x[starts[has] + counts[has] // 2]) / 2
    return out


@pytest.mark.parametrize("seed", range(12))
def test_per_step_medians_on_the_grid_equal_the_lexsort(seed: int) -> None:
    rng = np.random.default_rng(seed)
    ranks, steps = int(rng.integers(1, 30)), int(rng.integers(1, 200))
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps), ranks)
    keep = rng.random(rank.size) < (0.7 if seed % 2 else 1.0)  # ranks missing steps
    rank, step = rank[keep], step[keep]
    v = np.round(rng.normal(1, 0.2, rank.size), 2)  # ties
    if seed % 4:  # seeds 0, 4, 8: every cell of the grid finite (its two-middles path)
        v[rng.random(v.size) < 0.1] = np.nan
    uniq, inv = unique_ints(step, return_inverse=True)
    slot = unique_ints(rank, return_inverse=True)[1]
    want = _median_by_lexsort(v, inv, uniq.size)
    assert np.array_equal(median_by(v, inv, uniq.size, slot), want, equal_nan=True)
    assert np.array_equal(median_by(v, inv, uniq.size), want, equal_nan=True)
    dup = np.r_[slot[:-1], slot[0]] if slot.size > 1 else slot  # a repeated cell: the sort
    assert np.array_equal(median_by(v, inv, uniq.size, dup), want, equal_nan=True)


@pytest.mark.parametrize("seed", range(12))
def test_per_step_medians_of_a_full_grid_equal_the_lexsort(seed: int) -> None:
    """The regime search's per-step CPU-share and preemption medians, taken on the rank x
    step grid when every rank has every step: the same numbers as the general path."""
    rng = np.random.default_rng(seed)
    ranks, steps = int(rng.integers(1, 30)), int(rng.integers(2, 200))
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps) * 2, ranks)  # steps 0, 2, 4, ...
    st = np.round(rng.uniform(0.5, 1.5, rank.size), 2)
    cols = {"rank": rank, "step": step, "step_time_s": st,
            "end_s": np.cumsum(st.reshape(ranks, steps), axis=1).ravel(),
            "cpu_s": np.round(st * rng.uniform(0.2, 1.0, rank.size), 2),  # ties
            "preempt": rng.integers(0, 3, rank.size).astype(float)}
    if seed % 3 == 0:
        cols["cpu_s"][int(rng.integers(0, rank.size))] = np.nan  # one gap: the general path
    table = StepTable.from_columns(cols)
    grid = step_grid(table)
    assert grid is not None and grid.pos is None
    uniq, inv = unique_ints(step, return_inverse=True)
    v = cols["cpu_s"] / regimes.usage_wall(table)
    got = grid.median_over_ranks(v)
    if seed % 3 == 0:
        assert got is None
    else:
        assert got is not None
        assert np.array_equal(got, _median_by_lexsort(v, inv, uniq.size))
    fast = regimes._per_step(table)
    with general_path():
        slow = regimes._per_step(StepTable.from_columns(cols))
    assert fast.keys() == slow.keys()
    for k in fast:
        assert np.array_equal(fast[k], slow[k], equal_nan=True), k
    assert step_grid(StepTable.from_columns({k: c[1:] for k, c in cols.items()})
                     ).median_over_ranks(v[1:]) is None  # a missing row: no full grid


@pytest.mark.parametrize("seed", range(12))
def test_first_and_last_loss_equal_the_step_rank_sort(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 400))
    t = StepTable.from_columns({
        "rank": rng.integers(0, 4, n), "step": rng.integers(0, 20, n),
        "loss": np.where(rng.random(n) < 0.3, np.nan, rng.normal(3, 1, n))})
    order = np.lexsort((t["rank"], t["step"]))
    finite = t["loss"][order][np.isfinite(t["loss"][order])]
    want = ((float(finite[0]), float(finite[-1]), float(finite.min())) if finite.size
            else (None, None, None))
    assert summary._loss_stats(t) == want


def _old_metric_boot(name: str, s, n_boot: int, seed: int, which: int) -> np.ndarray:
    """Before: each metric blocked the run and drew its weights again, chunk by chunk."""
    stat = METRICS[name].stat
    b = s.blocked(speed.MAX_BOOT_UNITS)
    rng = np.random.default_rng([seed, which])
    chunk = max(1, CHUNK_FLOATS // max(1, b.step_time.size))
    return np.concatenate([stat(b, speed._weights(rng, b.n_steps, min(chunk, n_boot - lo)))
                           for lo in range(0, n_boot, chunk)])


def _run(seed: int, ranks: int, steps: int) -> StepTable:
    rng = np.random.default_rng(seed)
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps), ranks)
    st = rng.gamma(50, 0.02, rank.size)
    return StepTable.from_columns({
        "rank": rank, "step": step, "step_time_s": st, "tokens": np.full(rank.size, 4096.0),
        "samples": np.full(rank.size, 8.0), "data_wait_s": st * 0.02,
        "comm_exposed_s": st * rng.uniform(0.01, 0.05, rank.size)})


@pytest.mark.parametrize("ranks,steps", [(4, 300), (64, 1500), (300, 40)])
def test_bootstrap_drawn_once_per_run_equals_one_draw_per_metric(ranks: int, steps: int
                                                                 ) -> None:
    ta, tb = _run(1, ranks, steps), _run(2, ranks, steps)
    sa, sb = step_sample(ta), step_sample(tb)
    boots = (speed._Boot.of(sa, 200, 7, 0), speed._Boot.of(sb, 200, 7, 1))

    for boot, s, which in ((boots[0], sa, 0), (boots[1], sb, 1)):  # the same draws, exactly
        b = s.blocked(speed.MAX_BOOT_UNITS)
        rng = np.random.default_rng([7, which])
        chunk = max(1, CHUNK_FLOATS // max(1, b.step_time.size))
        old = [speed._weights(rng, b.n_steps, min(chunk, 200 - lo)) for lo in range(0, 200, chunk)]
        assert np.array_equal(np.concatenate(boot.weights), np.concatenate(old))
    with shared_products([w for b in boots for w in b.weights]):
        for name in METRICS:
            for boot, s, which in ((boots[0], sa, 0), (boots[1], sb, 1)):
                # The weights are multiplied in larger chunks than they are drawn: the
                # products' sums may round differently in the last bits (BLAS blocking).
                np.testing.assert_allclose(boot.replicates(METRICS[name].stat),
                                           _old_metric_boot(name, s, 200, 7, which),
                                           rtol=1e-12, atol=0, equal_nan=True)
    ledger = speed.speed_ledger(ta, None, tb, None, seed=7, n_boot=200)
    assert ledger.metrics["tokens_per_s"].ci_rel is not None


def _old_thinned(s):  # the lexsort of every row, as before
    import dataclasses

    from stepscope.analysis.compare import sample
    n_units = s.n_steps
    if s.rows_sorted.size <= sample._EXACT_MEDIAN_ROWS or not n_units:
        return s
    k = max(1, sample._EXACT_MEDIAN_ROWS // n_units)
    order = np.lexsort((s.rows_sorted, s.rows_unit))
    count = np.bincount(s.rows_unit, minlength=n_units)
    start = np.concatenate(([0], np.cumsum(count)[:-1]))
    has = np.flatnonzero(count)
    pos = start[has, None] + ((np.arange(k) + 0.5) * count[has, None] / k).astype(np.int64)
    vals = s.rows_sorted[order][pos].ravel()
    units = np.repeat(has, k)
    weight = np.repeat(count[has], k).astype(np.float64)  # k x count/k, as now
    by_value = np.argsort(vals, kind="stable")
    return dataclasses.replace(s, rows_sorted=vals[by_value], rows_unit=units[by_value],
                               rows_weight=weight[by_value])


@pytest.mark.parametrize("ranks,steps,units", [(300, 400, 1000), (64, 1500, 1000),
                                               (200, 300, 7)])
def test_thinned_rows_equal_the_lexsort_of_every_row(ranks: int, steps: int, units: int
                                                     ) -> None:
    t = _run(3, ranks, steps)
    st = t["step_time_s"].copy()
    st[::7] = np.round(st[::7], 1)  # ties between values
    s = step_sample(StepTable.from_columns({**{c: t[c] for c in t.columns
                                               if t[c].strides != (0,)}, "step_time_s": st}))
    import dataclasses
    length = -(-s.n_steps // units) if s.n_steps > units else 1
    got = s.blocked(units)
    base = s if length == 1 else dataclasses.replace(
        s, rows_unit=(np.arange(s.n_steps) // length)[s.rows_unit],
        step_time=got.step_time, tokens=got.tokens, samples=got.samples,
        data_wait=got.data_wait, comm_exposed=got.comm_exposed, present=got.present)
    want = _old_thinned(base)
    for name in ("rows_sorted", "rows_unit", "rows_weight"):
        assert np.array_equal(getattr(got, name), getattr(want, name))


def test_the_steady_mask_of_a_large_table_is_computed_once() -> None:
    """The sheet, the health rules and the ledgers each ask for it: past 256 rows a key of
    ``len(table)`` (a new int object every time) once made each ask recompute it."""
    rng = np.random.default_rng(0)
    n = 4000
    t = StepTable.from_columns({"rank": np.repeat(np.arange(4), n // 4),
                                "step": np.tile(np.arange(n // 4), 4),
                                "step_time_s": rng.uniform(0.9, 1.1, n)})
    first = summary.steady_mask(t)
    assert summary.steady_mask(t) is first
    assert np.array_equal(first, summary._steady_mask(t["rank"], t["step"], t["step_time_s"],
                                                      None, None))
    # The shared mechanism: a key holding a number matches by value, not identity.
    calls = []
    kept = LastResult(lambda a, k: calls.append(k) or k)
    big = t["rank"]
    kept((big,), (int("4000"),))
    kept((big,), (int("4000"),))  # an equal int, another object
    assert calls == [4000]


@pytest.mark.parametrize("seed", range(30))
def test_checkpointed_weighted_median_equals_the_row_scan(seed: int) -> None:
    """The bootstrap median from block checkpoints equals the cumulative sum over every row,
    exactly: ties between values, zero-weight units (undrawn), a last short block, thinned
    rows with integer weights, replicates that weigh one unit only."""
    import dataclasses

    from stepscope.analysis.compare import sample
    rng = np.random.default_rng(seed)
    n_units = int(rng.integers(1, 400))
    n_rows = int(rng.integers(1, 6000))
    unit = np.sort(rng.integers(0, n_units, n_rows)) if seed % 3 == 0 else \
        rng.integers(0, n_units, n_rows)
    vals = rng.gamma(4, 0.25, n_rows)
    if seed % 2:
        vals = np.round(vals, 1)  # many ties
    order = np.argsort(vals, kind="stable")
    row_w = rng.integers(1, 60, n_rows).astype(np.float64) if seed % 4 == 1 else \
        np.broadcast_to(np.float64(1.0), (n_rows,))
    base = step_sample(_run(0, 2, 8))
    s = dataclasses.replace(base, rows_sorted=vals[order],
                            rows_unit=unit[order].astype(np.int32),
                            rows_weight=row_w if row_w.strides == (0,) else row_w[order])
    w = speed._weights(rng, n_units, 64)
    w[0] = 0.0
    w[0, int(rng.integers(0, n_units))] = 3.0  # one unit alone (or one absent: all zero)
    w[1] = 1.0
    w[1, : n_units // 2] = 0.0  # a split half
    want = sample._median_scan(s, w)
    got = sample._median_checkpointed(s, w)
    assert np.array_equal(got, want)
    # and the scan is the median: each row repeated by its weight
    row_weight = np.broadcast_to(s.rows_weight, (n_rows,))
    for r in range(4):
        rep = np.repeat(s.rows_sorted, (w[r, s.rows_unit] * row_weight).astype(np.int64))
        if rep.size:
            assert want[r] == np.median(rep)


@pytest.mark.parametrize("seed", range(24))
def test_chunked_order_check_equals_the_diff_of_every_row(seed: int,
                                                         monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """``is_ordered`` a chunk at a time equals the whole-column ``np.diff`` it replaced,
    for a break anywhere (the first pair, a chunk's first or last pair, the last pair), by
    rank alone and strictly."""
    from stepscope import _fastnp
    chunk = [1, 7, 64][seed % 3]
    monkeypatch.setattr(_fastnp, "_ORDER_CHUNK", chunk)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 400))
    rank = np.sort(rng.integers(0, 5, n))
    per_rank = np.bincount(rank, minlength=5)
    step = np.concatenate([np.sort(rng.integers(0, 30, c)) for c in per_rank])

    def oracle(r: np.ndarray, s: np.ndarray | None, strict: bool) -> bool:
        if r.size < 2:
            return True
        dr = np.diff(r)
        if s is None:
            return bool((dr >= 0).all())
        ds = np.diff(s)
        return bool(np.all((dr > 0) | ((dr == 0) & ((ds > 0) if strict else (ds >= 0)))))

    cases = [(rank, step)]
    for i in {1, chunk, chunk + 1, n - 1, int(rng.integers(1, max(2, n)))}:
        if 1 <= i < n:  # rows i-1 and i swapped: their rank (or step) out of order
            r, st = rank.copy(), step.copy()
            (r[[i - 1, i]], st[[i - 1, i]]) = ((r[[i, i - 1]], st[[i - 1, i]]) if seed % 2
                                               else (r[[i - 1, i]] + [1, 0], st[[i, i - 1]]))
            cases.append((r, st))
    broken = 0
    for r, st in cases:
        for s_, strict in ((st, False), (st, True), (None, False)):
            want = oracle(r, s_, strict)
            assert is_ordered(r, s_, strict=strict) == want
            broken += not want
    assert n < 2 or broken  # the breaks were real ones


@pytest.mark.parametrize("at", [None, 0, 4095, 4096, 9999])
def test_has_data_probes_the_first_rows_and_still_sees_a_value_anywhere(at: int | None
                                                                         ) -> None:
    """A column's only finite value at any row (before, at and past the first-rows probe)
    is data; infinities, NaN throughout, a never-recorded column are not."""
    n = 10_000
    loss = np.full(n, np.nan)
    loss[::3] = np.inf
    if at is not None:
        loss[at] = 2.5
    t = StepTable.from_columns({"rank": np.zeros(n, int), "step": np.arange(n),
                                "step_time_s": np.ones(n), "loss": loss})
    assert t.has_data("loss") is (at is not None)
    assert not t.has_data("mfu") and not t.has_data("no_such_column")
    assert t.has_data("loss") == bool(np.isfinite(t["loss"]).any())
    # a selection is probed at its first rows before its column is taken, and still sees
    # a value anywhere in it, or none outside it
    for rows in (np.arange(n) % 2 == 0, np.arange(n) >= 5000, np.arange(n)[::-7]):
        part = t.select(rows)
        want = bool(np.isfinite(loss[rows]).any())
        assert part.has_data("loss") is want
        assert part.has_data("loss") is want  # again, with the column taken or not
        assert not part.has_data("mfu")


@pytest.mark.parametrize("seed", range(16))
def test_rank_medians_of_equal_groups_equal_one_median_per_slice(seed: int) -> None:
    """Per-rank medians taken in one call on the (ranks x steps) grid when every rank has
    as many rows and all are finite; else per slice. The same numbers, bit for bit."""
    from stepscope.analysis._groups import Groups
    rng = np.random.default_rng(seed)
    ranks, steps = int(rng.integers(1, 40)), int(rng.integers(1, 60))
    rank = np.repeat(np.arange(ranks), steps)
    x = np.round(rng.gamma(50, 0.02, rank.size), 2)  # ties
    if seed % 4 == 1:
        x[int(rng.integers(0, x.size))] = np.nan  # one gap: per slice
    if seed % 4 == 2 and ranks > 1:
        rank, x = rank[1:], x[1:]  # unequal groups: per slice
    g = Groups.of(rank)
    for skip in (False, True):
        want = []
        for r in range(ranks):
            part = x[rank == r][int(skip):]
            part = part[np.isfinite(part)]
            want.append(np.median(part) if part.size else np.nan)
        assert np.array_equal(g.medians(x, skip_first=skip), np.array(want), equal_nan=True)


@pytest.mark.parametrize("seed", range(40))
def test_per_step_series_on_the_grid_equal_the_scatter(seed: int) -> None:
    """The slowest rank's step time, summed tokens and latest wall time per step, as grid
    reductions (full grids and grids with missing rows), equal the scatter over an inverse
    of every row, bit for bit; shuffled rows (no grid) take the scatter itself."""
    rng = np.random.default_rng(seed)
    ranks, steps = int(rng.integers(1, 30)), int(rng.integers(1, 200))
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps), ranks)
    st = rng.gamma(4, 0.05, rank.size)
    st[rng.random(rank.size) < 0.05] = [np.nan, np.inf][seed % 2]
    tokens = rng.gamma(2, 700.3, rank.size)  # not integers: the order of the sum shows
    tokens[rng.random(rank.size) < 0.05] = np.nan
    tokens[rng.random(rank.size) < 0.01] = np.inf
    wall = 1.7e9 + rng.random(rank.size) * 100  # with each value nan_to_num maps
    wall[rng.random(rank.size) < 0.1] = [np.nan, np.inf, -np.inf][seed % 3]
    cols = {"rank": rank, "step": step, "step_time_s": st, "tokens": tokens,
            "wall_time_s": wall,
            "cpu_s": st * 0.8, "end_s": np.cumsum(np.nan_to_num(st, posinf=1.0))}
    if seed % 4 == 1:
        del cols["tokens"]
    keep = rng.random(rank.size) > [0.0, 0.2, 0.4][seed % 3]
    table = StepTable.from_columns({k: v[keep] for k, v in cols.items()})
    if seed % 5 == 4:  # shuffled rows: no grid, the scatter
        table = StepTable.from_columns({k: v[keep][rng.permutation(int(keep.sum()))]
                                        for k, v in cols.items()})
    with np.errstate(over="ignore"):  # infinite tokens sum as the largest floats, both ways
        fast = regimes._per_step(table)
        with general_path():
            slow = regimes._per_step(table)
    assert fast.keys() == slow.keys()
    for k in fast:
        assert np.array_equal(fast[k], slow[k], equal_nan=True), k
