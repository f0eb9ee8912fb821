"""The vectorised sheet and split search give exactly what the per-rank loops gave.

Oracles: the loops as they were (tests/support/old_vector_oracles.py). Tables are random
but seeded: shuffled row order, NaN step times and phases, ranks missing a column, tiny
ranks (1-2 steps) and warm-up steps, i.e. every branch of the warm-up rule.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from stepscope.analysis import summary
from stepscope.analysis.health.stats import best_split
from stepscope.schema import StepTable
from support import old_vector_oracles as old


def _table(seed: int) -> StepTable:
    rng = np.random.default_rng(seed)
    ranks, steps = int(rng.integers(1, 40)), int(rng.integers(1, 60))
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps), ranks)
    st = rng.gamma(2, 0.3, rank.size)
    st[step == 0] *= 5
    st[(step < 4) & (rank % 3 == 0)] *= 3
    if seed % 3 == 0:
        st[rng.random(rank.size) < 0.1] = np.nan
    perm = rng.permutation(rank.size) if seed % 2 else np.arange(rank.size)
    cols = {"rank": rank, "step": step, "step_time_s": st,
            "tokens": rng.integers(1, 1000, rank.size).astype(float),
            "forward_s": st * 0.3, "data_wait_s": st * 0.01,
            "comm_s": np.where(rng.random(rank.size) < 0.3, np.nan, st * 0.1)}
    if seed % 5 == 0:
        cols["optimizer_s"] = np.where(rank == 0, np.nan, st * 0.05)
    return StepTable.from_columns({k: v[perm] for k, v in cols.items()})


@pytest.mark.parametrize("seed", range(60))
def test_sheet_per_rank_parts_equal_the_loops_bit_for_bit(seed: int) -> None:
    t = _table(seed)
    assert np.array_equal(summary.steady_mask(t), old.steady_mask(t))
    steady = t.select(summary.steady_mask(t))
    for col in ("tokens", "step_time_s"):
        assert summary.throughput(steady, col) == old._throughput(steady, col)
    assert [dataclasses.asdict(x) for x in summary._rank_lines(steady)] == \
        old._rank_lines(steady)


@pytest.mark.parametrize("seed", range(120))
def test_best_split_equals_the_loop(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n, min_segment = int(rng.integers(2, 3000)), int(rng.integers(1, 50))
    y = [rng.normal(0, 1, n), np.round(rng.normal(0, 1, n), 1), np.ones(n),
         np.r_[np.ones(n // 2), 2 * np.ones(n - n // 2)] + rng.normal(0, .01, n)][seed % 4]
    if seed % 7 == 0:
        y[::5] = np.nan
    assert best_split(y, min_segment) == old.best_split(y, min_segment)


def test_rank_series_equals_the_mask_per_rank_and_forgets_dead_tables() -> None:
    import gc

    from stepscope.analysis.health import stats

    rng = np.random.default_rng(3)
    for _ in range(30):
        n = int(rng.integers(0, 400))
        t = StepTable.from_columns({"rank": rng.integers(0, 8, n), "step": rng.integers(0, 30, n),
                                    "step_time_s": rng.random(n)})
        for r in range(-1, 10):
            idx = np.flatnonzero(t["rank"] == r)
            idx = idx[np.argsort(t["step"][idx], kind="stable")]
            steps, values = stats.rank_series(t, r, "step_time_s")
            assert np.array_equal(steps, t["step"][idx])
            assert np.array_equal(values, t["step_time_s"][idx])
    del t
    gc.collect()
    assert not stats._ORDER_CACHE


@pytest.mark.parametrize("seed", range(20))
def test_worst_rank_share_equals_one_table_copy_per_rank(seed: int) -> None:
    from stepscope.analysis.health import system

    t = _table(seed)
    per_loop = {str(r): system._share(t.rank(r), "data_wait_s") for r in t.ranks()}
    worst, per = system._worst_rank(t, "data_wait_s")
    assert per == per_loop
    assert worst == (None if len(per) < 2 else int(max(per, key=lambda k: per[k])))


@pytest.mark.parametrize("seed", range(80))
def test_split_medians_bound_holds_for_every_split_best_split_may_choose(seed: int) -> None:
    from stepscope.analysis.health.stats import split_medians_bound

    rng = np.random.default_rng(seed)
    n, min_segment = int(rng.integers(2, 2500)), int(rng.integers(1, 300))
    y = [rng.gamma(2, 1, n), np.round(rng.normal(5, 1, n), 0), np.ones(n),
         np.r_[np.ones(n // 2), 3 * np.ones(n - n // 2)]][seed % 4]
    lo, hi = split_medians_bound(y, min_segment)
    if best_split(y, min_segment) is None:
        assert np.isnan(lo) and np.isnan(hi)
        return
    block = max(1, int(np.ceil(n / 400)))
    seg = max(1, min_segment // block)
    for k in range(seg * block, (n // block - seg) * block + 1, block):  # every candidate
        for part in (y[:k], y[k:]):
            assert lo <= float(np.median(part)) <= hi


@pytest.mark.parametrize("seed", range(60))
def test_throughput_rule_skips_only_ranks_the_full_test_would_pass_over(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefilter (quarter medians and split-median bounds) changes no finding: the rule
    with the bound forced open (every rank split and correlated) finds the same."""
    from stepscope.analysis.health import system
    from stepscope.analysis.health.config import HealthConfig, HealthContext

    rng = np.random.default_rng(seed)
    ranks, steps = int(rng.integers(1, 12)), int(rng.integers(40, 900))
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps), ranks)
    shape = (50, 2000, 20000)[seed % 3]  # step-time noise 14%, 2.2%, 0.7%
    st = rng.gamma(shape, 0.1 / shape * (1 + (seed % 4) * 0.05), rank.size)
    slow = rng.integers(0, ranks)
    at = int(rng.integers(0, steps))
    drop = [1.0, 1.15, 1.3, 1.6][seed % 4]
    st[(rank == slow) & (step >= at)] *= drop
    if seed % 5 == 0:  # a drift on one rank
        st[rank == slow] *= 1 + np.linspace(0, 0.5 * (seed % 3), steps)
    t = StepTable.from_columns({"rank": rank, "step": step, "step_time_s": st,
                                "tokens": np.full(rank.size, 512.0)})
    ctx = HealthContext(table=t, meta=None, config=HealthConfig(),
                        steady=np.ones(len(t), bool))
    split = system.best_split
    splits: list[int] = []
    monkeypatch.setattr(system, "best_split", lambda y, s: splits.append(1) or split(y, s))
    got = [(r, system._rank_throughput(t, r, ctx)) for r in t.ranks()]
    if seed % 3 and ranks > 1:  # quiet ranks without a drop: the prefilter skips them
        assert len(splits) < ranks
    monkeypatch.setattr(system, "split_medians_bound", lambda y, s: (0.0, 1.0))
    want = [(r, system._rank_throughput(t, r, ctx)) for r in t.ranks()]
    assert [(r, f and f.to_dict()) for r, f in got] == [(r, f and f.to_dict()) for r, f in want]


@pytest.mark.parametrize("seed", range(10))
def test_rank_values_equals_the_mask_per_rank(seed: int) -> None:
    from stepscope.analysis.health.stats import rank_values

    t = _table(seed)
    own = np.random.default_rng(seed).random(len(t))
    got = rank_values(t, own)
    assert list(got) == t.ranks()
    for r in t.ranks():
        assert sorted(got[r].tolist()) == sorted(own[t["rank"] == r].tolist())


def _stall_table(seed: int) -> StepTable:
    """Random ranks with a gap planted on some: missing steps, no end time (wall time only),
    infinite or missing step times, stepscope's own and evaluation time before a step."""
    rng = np.random.default_rng(seed)
    ranks, steps = int(rng.integers(1, 30)), int(rng.integers(1, 80))
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps), ranks)
    st = rng.gamma(4, 0.05, rank.size)
    end = np.zeros(rank.size)
    for r in range(ranks):
        own = rank == r
        e = np.cumsum(st[own])
        if rng.random() < 0.4:  # a gap of 0.5-3 s somewhere (the limit: 1 s or 10 steps)
            e[int(rng.integers(0, steps)):] += rng.uniform(0.5, 3.0)
        end[own] = e
    cols: dict[str, object] = {"rank": rank, "step": step, "step_time_s": st, "end_s": end,
                               "wall_time_s": 1e9 + end}
    if seed % 2:
        cols["tool_s"] = np.where(rng.random(rank.size) < 0.1, rng.uniform(0, 2, rank.size),
                                  np.nan)
        cols["eval_s"] = np.where(rng.random(rank.size) < 0.05, 2.5, np.nan)
    if seed % 3 == 0:  # ranks that only have wall times
        cols["end_s"] = np.where(rank % 4 == 1, np.nan, end)
    if seed % 5 == 0:
        st[rng.random(rank.size) < 0.05] = np.inf
        st[rank == 0] = np.nan
    keep = rng.random(rank.size) > (0.1 if seed % 4 == 0 else 0.0)  # lost records
    perm = rng.permutation(int(keep.sum())) if seed % 2 else np.arange(int(keep.sum()))
    return StepTable.from_columns({k: np.asarray(v)[keep][perm] for k, v in cols.items()})


@pytest.mark.parametrize("seed", range(80))
def test_stall_rule_screens_ranks_without_changing_what_it_finds(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The vectorised screen judges only ranks the full check could flag: the rule over
    every rank finds the same stall (same rank, steps, gap), and quiet ranks are skipped."""
    from stepscope.analysis.health import ranks as rk
    from stepscope.analysis.health.config import HealthConfig, HealthContext

    t = _stall_table(seed)
    ctx = HealthContext(table=t, meta=None, config=HealthConfig(),
                        steady=np.ones(len(t), bool))
    screened = rk._stall_suspects(t, ctx.config.stall_factor, ctx.config.stall_min_s)
    got = [f.to_dict() for f in rk.rule_stall(ctx)]
    monkeypatch.setattr(rk, "_stall_suspects", lambda t, *a: t.ranks())
    want = [f.to_dict() for f in rk.rule_stall(ctx)]
    assert got == want
    assert set(screened) <= set(t.ranks())
    if want:
        assert screened  # the stall's rank was kept
    if seed % 5 and len(t.ranks()) > 4 and not want:
        assert len(screened) < len(t.ranks())  # quiet ranks are not judged one by one


def _numerics_table(seed: int) -> StepTable:
    """Random ranks, some with a NaN (flagged or dropped before logging), an Inf, or a
    column that is mostly missing; fp16 overflow steps skipped; rows shuffled."""
    rng = np.random.default_rng(seed)
    ranks, steps = int(rng.integers(1, 25)), int(rng.integers(1, 60))
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps), ranks)
    loss = rng.gamma(5, 0.5, rank.size)
    gn = rng.gamma(3, 0.3, rank.size)
    cols: dict[str, object] = {"rank": rank, "step": step,
                               "step_time_s": rng.gamma(4, 0.05, rank.size)}
    for r in range(ranks):
        own = np.flatnonzero(rank == r)
        kind = rng.integers(0, 8)
        at = own[rng.integers(0, own.size):]
        if kind == 0:
            loss[at] = np.nan  # dropped before logging: a gap
        elif kind == 1:
            gn[at[:1]] = np.inf
        elif kind == 2:
            gn[own[rng.random(own.size) < 0.9]] = np.nan  # rarely logged
        elif kind == 3:
            loss[own[-1:]] = np.nan  # the last record lost at exit
    cols["loss"], cols["grad_norm"] = loss, gn
    if seed % 3 == 0:
        cols["loss_nan"] = np.where(rng.random(rank.size) < 0.02, 1.0, np.nan)
    if seed % 4 == 0:
        cols["overflow"] = (rng.random(rank.size) < 0.1).astype(float)
    if seed % 5 == 0:
        del cols["grad_norm"]  # never recorded
    keep = rng.random(rank.size) > (0.1 if seed % 2 else 0.0)
    perm = rng.permutation(int(keep.sum())) if seed % 2 else np.arange(int(keep.sum()))
    return StepTable.from_columns({k: np.asarray(v)[keep][perm] for k, v in cols.items()})


@pytest.mark.parametrize("seed", range(80))
def test_numerics_rule_screens_ranks_without_changing_what_it_finds(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepscope.analysis.health import numerics
    from stepscope.analysis.health.config import HealthConfig, HealthContext

    t = _numerics_table(seed)
    ctx = HealthContext(table=t, meta=None, config=HealthConfig(),
                        steady=np.ones(len(t), bool))
    screened = numerics._nonfinite_suspects(t)
    got = [f.to_dict() for f in numerics.rule_numerics(ctx)]
    monkeypatch.setattr(numerics, "_nonfinite_suspects", lambda t: t.ranks())
    want = [f.to_dict() for f in numerics.rule_numerics(ctx)]
    assert got == want
    if want:
        assert want[0]["rank"] in screened
    if len(t.ranks()) > 8 and seed % 3:
        assert len(screened) < len(t.ranks())  # clean ranks are not judged one by one


@pytest.mark.parametrize("seed", range(30))
def test_straggler_medians_and_consistency_equal_the_per_rank_loop(seed: int) -> None:
    """The rank medians (one pass over the rank groups) and the share of slow steps (np.median
    where every other rank has the step, else nanmedian) are the loop's numbers exactly."""
    import warnings

    from stepscope.analysis.health import ranks as rk
    from stepscope.analysis.health.config import HealthConfig, HealthContext

    rng = np.random.default_rng(seed)
    ranks, steps = int(rng.integers(2, 20)), int(rng.integers(5, 300))
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps), ranks)
    st = rng.gamma(50, 0.002, rank.size) + 0.2
    comm = st * 0.3
    slow = int(rng.integers(0, ranks))
    comm[rank != slow] += 0.08  # the others wait for it
    if seed % 3 == 0:
        comm[rng.random(rank.size) < 0.05] = np.nan  # no comm time: own time = step time
    keep = rng.random(rank.size) > (0.1 if seed % 2 else 0.0)
    perm = rng.permutation(int(keep.sum()))
    cols = {"rank": rank, "step": step, "step_time_s": st, "comm_s": comm}
    t = StepTable.from_columns({k: v[keep][perm] for k, v in cols.items()})
    ctx = HealthContext(table=t, meta=None, config=HealthConfig(),
                        steady=np.ones(len(t), bool))
    (f,) = rk.rule_straggler(ctx)
    own = t["step_time_s"] - np.nan_to_num(t["comm_s"])
    want = {}
    for r in t.ranks():
        v = own[t["rank"] == r]
        want[str(r)] = float(np.median(v[np.isfinite(v)]))
    assert f.rank == slow and f.evidence["per_rank_median_s"] == want
    grid = np.full((steps, ranks), np.nan)
    grid[t["step"], t["rank"]] = own
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        ref = np.nanmedian(np.delete(grid, slow, axis=1), axis=1)
    ok = np.isfinite(grid[:, slow]) & np.isfinite(ref)
    assert f.evidence["slow_on_step_frac"] == float(np.mean(grid[ok, slow] > ref[ok]))
