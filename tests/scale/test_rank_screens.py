"""The throughput and memory rules judge only the ranks their screens keep
(``health/screens.py``), and find what they find over every rank: the same finding, rank,
steps and numbers. Tables are random but seeded: drops, drifts and memory creep planted on
some ranks, NaN and zero step times, ranks without token counts, lost records (ranks of
unequal length), shuffled rows, series too short for a split."""

from __future__ import annotations

import numpy as np
import pytest

from stepscope.analysis.health import screens, system
from stepscope.analysis.health.config import HealthConfig, HealthContext
from stepscope.schema import StepTable


def _table(seed: int) -> StepTable:
    rng = np.random.default_rng(seed)
    ranks, steps = int(rng.integers(1, 40)), int(rng.integers(10, 700))
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps), ranks)
    shape = (50, 2000, 20000)[seed % 3]  # step-time noise 14%, 2.2%, 0.7%
    st = rng.gamma(shape, 0.1 / shape, rank.size)
    peak = 4e9 + rng.normal(0, 2e6, rank.size)
    for r in rng.choice(ranks, size=min(ranks, int(rng.integers(0, 3))), replace=False):
        own, kind = rank == r, int(rng.integers(0, 4))
        at = int(rng.integers(0, steps))
        if kind == 0:  # a step change
            st[own & (step >= at)] *= rng.choice([1.15, 1.24, 1.26, 1.3, 1.6])
        elif kind == 1:  # a drift
            st[own] *= 1 + np.linspace(0, rng.uniform(0.1, 0.8), steps)
        elif kind == 2:  # memory creep, or one allocation (a level change)
            peak[own] += np.linspace(0, rng.uniform(1e7, 5e8), steps)
        else:
            peak[own & (step >= at)] += 2e8
    cols = {"rank": rank, "step": step, "step_time_s": st,
            "tokens": np.full(rank.size, 512.0), "mem_peak_bytes": peak}
    if seed % 4 == 1:  # NaN, zero and infinite values
        st[rng.random(rank.size) < 0.01] = rng.choice([np.nan, 0.0, np.inf])
        peak[rng.random(rank.size) < 0.01] = np.nan
    if seed % 5 == 2:  # a rank without token counts (steps/s), another with a few
        cols["tokens"] = np.where(rank == 0, np.nan, 512.0)
        cols["tokens"][(rank == ranks - 1) & (step % 7 == 0)] = np.nan
    keep = rng.random(rank.size) > (0.05 if seed % 6 == 3 else 0.0)  # lost records
    perm = rng.permutation(int(keep.sum())) if seed % 2 else np.arange(int(keep.sum()))
    return StepTable.from_columns({k: np.asarray(v)[keep][perm] for k, v in cols.items()})


@pytest.mark.parametrize("seed", range(90))
def test_screened_rules_find_what_they_find_over_every_rank(
        seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    t = _table(seed)
    ctx = HealthContext(table=t, meta=None, config=HealthConfig(),
                        steady=np.ones(len(t), bool))
    kept = (screens.throughput_suspects(t, ctx.config), screens.creep_suspects(t, ctx.config))
    got = [f.to_dict() for f in system.rule_throughput(ctx) + system.rule_memory(ctx)]
    monkeypatch.setattr(system, "throughput_suspects", lambda t, cfg: t.ranks())
    monkeypatch.setattr(system, "creep_suspects", lambda t, cfg: t.ranks())
    want = [f.to_dict() for f in system.rule_throughput(ctx) + system.rule_memory(ctx)]
    assert got == want
    for screened in kept:
        assert screened == sorted(set(screened)) and set(screened) <= set(t.ranks())


def test_the_screens_skip_quiet_ranks_and_keep_the_one_that_moves() -> None:
    rng = np.random.default_rng(7)
    ranks, steps = 64, 400
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps), ranks)
    st = rng.gamma(2000, 0.1 / 2000, rank.size)
    st[(rank == 9) & (step >= 200)] *= 1.5  # rank 9 slows down by a half
    peak = 4e9 + rng.normal(0, 1e6, rank.size)
    peak[rank == 17] += np.linspace(0, 4e8, steps)  # rank 17 creeps
    t = StepTable.from_columns({"rank": rank, "step": step, "step_time_s": st,
                                "tokens": np.full(rank.size, 512.0), "mem_peak_bytes": peak})
    cfg = HealthConfig()
    assert screens.throughput_suspects(t, cfg) == [9]
    assert screens.creep_suspects(t, cfg) == [17]
    ctx = HealthContext(table=t, meta=None, config=cfg, steady=np.ones(len(t), bool))
    assert [f.rank for f in system.rule_memory(ctx) if f.severity == "warning"] == [17]
    assert system.rule_throughput(ctx)[0].rank == 9
