"""The speed ledger reduces each run's sample before the next run's is made (the 9.6 M
record pair peaked at 4.2 GB holding both): the ledger, and each sample, are those of the
previous implementation, which held both runs' samples and the whole sheet, bit for bit.

Oracle: ``support.old_compare_speed`` (the code before the change, verbatim).
"""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from stepscope.analysis.compare.sample import step_sample
from stepscope.analysis.compare.speed import speed_ledger
from stepscope.schema import RunMeta, StepTable
from support.old_compare_speed import old_speed_ledger, old_step_sample

_META = RunMeta(run_id="r", baseline={"num_devices": 8},
                environment={"flops_per_token": 6 * 7e9, "peak_flops_per_device": 989e12})


def _run(seed: int, ranks: int, steps: int, *, tokens: bool = True, holes: bool = False,
         outliers: int = 0, ties: bool = False) -> StepTable:
    rng = np.random.default_rng(seed)
    rank = np.repeat(np.arange(ranks), steps)
    step = np.tile(np.arange(steps), ranks)
    st = rng.gamma(50, 0.02, rank.size)
    if ties:  # step times at millisecond resolution: runs of equal values everywhere
        st = np.round(st, 3)
    st[step == 0] *= 3  # warm-up
    for s in rng.choice(np.arange(5, steps), size=outliers, replace=False):
        st[(step == s) & (rank == 0)] *= 6  # a slow step on one rank: an outlier step
    cols = {"rank": rank, "step": step, "step_time_s": st,
            "data_wait_s": st * 0.02, "comm_exposed_s": st * rng.uniform(0.01, 0.05, rank.size),
            "mem_peak_bytes": rng.uniform(1e9, 2e9, rank.size),
            "loss": 3.0 - step / steps}
    if tokens:
        cols |= {"tokens": np.full(rank.size, 4096.0), "samples": np.full(rank.size, 8.0)}
    table = StepTable.from_columns(cols)
    if holes:  # a rank that missed steps, and unreadable step times
        keep = ~((rank == ranks - 1) & (step % 7 == 3))
        st = table["step_time_s"].copy()
        st[::53] = np.nan
        table = StepTable.from_columns({**{c: table[c] for c in table.columns
                                           if table[c].strides != (0,)}, "step_time_s": st})
        table = table.select(keep)
    return table


_CASES = {
    "exact medians, outliers": (dict(ranks=4, steps=300, outliers=4),
                                dict(ranks=4, steps=300, outliers=1)),
    "blocked and thinned": (dict(ranks=64, steps=1500, outliers=3), dict(ranks=64, steps=1500)),
    "many ranks, few steps": (dict(ranks=300, steps=40), dict(ranks=300, steps=40, holes=True)),
    "equal step times, thinned": (dict(ranks=64, steps=1500, ties=True),
                                  dict(ranks=64, steps=1500, ties=True, outliers=2)),
    "equal step times, exact": (dict(ranks=4, steps=300, ties=True),
                                dict(ranks=4, steps=300, ties=True)),
    "no tokens in B, holes": (dict(ranks=8, steps=400, holes=True),
                              dict(ranks=8, steps=400, tokens=False)),
}


def _doc(ledger: object) -> bytes:
    return orjson.dumps(ledger.to_dict(), option=orjson.OPT_SERIALIZE_NUMPY)  # type: ignore[attr-defined]


@pytest.mark.parametrize("case", list(_CASES))
def test_ledger_run_by_run_equals_the_ledger_of_both_samples_held(case: str) -> None:
    ka, kb = _CASES[case]
    ta, tb = _run(1, **ka), _run(2, **kb)
    rep = _run(3, **ka)
    kw = dict(seed=5, n_boot=300, baseline_repeats=[(rep, _META)])
    got = speed_ledger(ta, _META, tb, _META, **kw)
    want = old_speed_ledger(ta, _META, tb, _META, **kw)
    assert _doc(got) == _doc(want)
    assert got.metrics["tokens_per_s"].a is not None  # the case compared something


@pytest.mark.parametrize("case", list(_CASES))
def test_sample_built_column_by_column_equals_the_old_sample(case: str) -> None:
    for kwargs, seed in zip(_CASES[case], (1, 2), strict=True):
        t = _run(seed, **kwargs)
        got, want = step_sample(t, _META), old_step_sample(t, _META)
        # Rows of equal step time may come in any order (no median depends on it): the
        # rows' units are compared within each value, sorted.
        canon = [np.lexsort((s.rows_unit, s.rows_sorted)) for s in (got, want)]
        assert np.array_equal(got.rows_unit[canon[0]], want.rows_unit[canon[1]])
        for name, value in vars(want).items():
            mine = getattr(got, name)
            if name == "rows_unit":
                continue
            if isinstance(value, np.ndarray):  # rows_unit is int32 now, same values
                assert mine.shape == value.shape and np.array_equal(mine, value), name
            else:
                assert mine == value, name
    assert got.rows_unit.dtype == np.int32
    assert got.rows_weight.strides == (0,)  # one shared weight until thinned
