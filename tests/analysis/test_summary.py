"""The sheet's arithmetic on hand-built tables: every number below is computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest

from stepscope.analysis.summary import run_mfu, steady_mask, summarize
from stepscope.calc.flops import mfu
from stepscope.schema import RunMeta, StepTable


def _table(**cols: list[float]) -> StepTable:
    n = len(next(iter(cols.values())))
    base: dict[str, list[float]] = {"rank": [0] * n, "step": list(range(n))}
    base.update(cols)
    return StepTable.from_columns(base)


def test_warmup_is_the_first_step_and_leading_slow_steps_capped_at_20pct() -> None:
    t = _table(step_time_s=[9.0, 5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    # step 0 always; step 1 is > 1.5x the median of the rest (1.0); cap = 20% of 10 = 2
    assert steady_mask(t).tolist() == [False, False] + [True] * 8
    t = _table(step_time_s=[9.0, 5.0, 5.0, 5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    assert steady_mask(t).sum() == 8  # the cap stops at 2 warm-up steps


def test_warmup_counts_steps_not_rows_and_not_later_profiled_steps() -> None:
    # 4 ranks; rank 2 warms up for 2 steps, the others for 1; step 6 is profiled on all.
    ranks, steps = 4, 10
    st = np.ones((ranks, steps))
    st[:, 0] = 9.0
    st[2, 1] = 9.0
    prof = np.zeros((ranks, steps))
    prof[:, 6] = 1.0
    t = StepTable.from_columns({
        "rank": np.repeat(np.arange(ranks), steps).astype(float),
        "step": np.tile(np.arange(steps), ranks).astype(float),
        "step_time_s": st.ravel(), "profiled": prof.ravel()})
    s = summarize(t)
    assert int((~steady_mask(t)).sum()) == 9  # rows: 4 + 1 warm-up, 4 profiled
    assert s.warmup_steps == 2  # steps 0 and 1: before some rank's first steady step


def test_throughput_is_summed_over_ranks_and_excludes_warmup() -> None:
    t = StepTable.from_columns({
        "rank": [0, 0, 0, 1, 1, 1], "step": [0, 1, 2, 0, 1, 2],
        "step_time_s": [5.0, 1.0, 1.0, 5.0, 2.0, 2.0],
        "tokens": [100.0] * 6, "samples": [4.0] * 6,
    })
    s = summarize(t)
    # rank 0: 200 tokens / 2 s = 100/s; rank 1: 200 / 4 s = 50/s; warm-up step 0 excluded
    assert s.tokens_per_s == pytest.approx(150.0)
    assert s.samples_per_s == pytest.approx(6.0)
    assert (s.steps, s.ranks, s.warmup_steps) == (3, 2, 1)  # one step (two rows)
    assert s.step_time_s == pytest.approx(1.5)  # median of 1, 1, 2, 2
    lines = {x.rank: x for x in s.per_rank}
    assert lines[0].tokens_per_s == pytest.approx(100.0)
    assert lines[1].step_time_s == pytest.approx(2.0)


def test_phase_split_uses_synced_rows_and_other_is_the_rest() -> None:
    t = _table(step_time_s=[3.0, 1.0, 1.0, 1.0], data_wait_s=[0.0, 0.1, 0.5, 0.1],
               forward_s=[1.0, 0.2, 0.1, 0.3], backward_s=[1.0, 0.4, 0.1, 0.4],
               optimizer_s=[1.0, 0.1, 0.1, 0.1], synced=[1.0, 1.0, 0.0, 1.0])
    s = summarize(t)
    # steady rows 1..3, synced ones: 1 and 3 (2 s of step time)
    assert s.phase_frac == pytest.approx({"data_wait": 0.1, "forward": 0.25,
                                          "backward": 0.4, "optimizer": 0.1, "other": 0.15})
    assert s.phase_source == "device-synced steps (2 of 3)"
    # the data-wait share of the sheet uses every steady row: 0.7 s of 3 s
    assert s.data_wait_frac == pytest.approx(0.7 / 3.0)


def test_mfu_and_hfu_from_run_metadata() -> None:
    t = _table(step_time_s=[2.0, 1.0, 1.0], tokens=[1000.0] * 3)
    meta = RunMeta(run_id="x", baseline={"num_devices": 2},
                   environment={"flops_per_token": 6e6, "hardware_flops_per_token": 8e6,
                                "peak_flops_per_device": 1e10, "flops_convention": "palm",
                                "peak_flops_source": "test"})
    s = summarize(t, meta)
    # 1000 tokens/s x 6e6 FLOPs / (2 devices x 1e10 FLOP/s) = 0.3
    assert s.mfu == pytest.approx(0.3) and s.hfu == pytest.approx(0.4)
    assert "palm" in s.mfu_note
    s = summarize(t, RunMeta(run_id="x", environment={"flops_per_token": 6e6}))
    assert s.mfu is None and "peak" in s.mfu_note


def test_one_mfu_for_the_sheet_and_a_live_throughput() -> None:
    """run_mfu (the sheet's, the index's and the demo's progress line's) is the calculator's
    formula over run.json's numbers; devices from run.json, else the ranks given."""
    env = {"flops_per_token": 6e6, "peak_flops_per_device": 1e10}
    one = RunMeta(run_id="x", environment=env)
    assert run_mfu(2500.0, one)[0] == pytest.approx(mfu(2500.0, 6e6, 1e10, 1)) == 1.5
    assert run_mfu(2500.0, one, ranks=4)[:2] == (pytest.approx(0.375), pytest.approx(0.375))
    eight = RunMeta(run_id="x", baseline={"num_devices": 8}, environment=env)
    assert run_mfu(2500.0, eight, ranks=4)[0] == pytest.approx(2500 * 6e6 / (8 * 1e10))
    for tps, meta, why in ((0.0, one, "no token counts"), (math.nan, one, "no token counts"),
                           (10.0, None, "FLOPs per token unknown"),
                           (10.0, RunMeta(run_id="x", environment={"flops_per_token": 6e6,
                                                                  "peak_flops_per_device": -1}),
                            "peak FLOP/s unknown")):
        got = run_mfu(tps, meta)
        assert got[:2] == (None, None) and why in got[2]


def test_loss_perplexity_and_missing_layers() -> None:
    t = _table(step_time_s=[1.0, 1.0, 1.0], loss=[math.nan, 3.0, 2.0])
    s = summarize(t)
    assert (s.loss_first, s.loss_last, s.loss_min) == (3.0, 2.0, 2.0)
    assert s.perplexity == pytest.approx(math.exp(2.0))
    assert s.mem_peak_bytes is None and s.comm_frac is None and s.tokens_per_s is None
    assert s.per_rank == []  # single rank: no per-rank table
    assert np.isfinite(s.step_time_s)


def test_sheet_states_the_loss_convention_and_the_time_between_steps() -> None:
    n = 6
    t = StepTable.from_columns({"rank": [0] * n, "step": list(range(n)),
                                "step_time_s": [0.1] * n, "tokens": [64.0] * n,
                                "eval_s": [0, 0, 0, 1.5, 0, 0], "checkpoint_s": [0.0] * n})
    meta = RunMeta(run_id="r", config={"loss_convention": "mean over the micro-batches (k = 2)"})
    notes = summarize(t, meta).notes
    assert "loss: mean over the micro-batches (k = 2)" in notes
    assert "between steps, not in step time: eval 1.5 s" in notes
    assert summarize(t.select(np.arange(n) != 3)).notes == []  # nothing to say


def test_profiled_steps_and_steps_mostly_stepscopes_own_are_not_steady() -> None:
    """A capture's steps and the profiler stop billed as tool_s stay out of
    throughput and compare (one steady-state definition)."""
    n = 10
    t = StepTable.from_columns({
        "step": np.arange(n), "rank": np.zeros(n, np.int64),
        "step_time_s": np.array([0.5] + [0.1] * 5 + [1.1] + [0.1] * 3),
        "tool_s": np.array([0.0] * 6 + [1.0] + [0.0] * 3),
        "profiled": np.array([0, 0, 0, 1, 1, 0, 0, 0, 0, 0], float),
        "samples": np.full(n, 10.0)})
    assert np.flatnonzero(steady_mask(t)).tolist() == [1, 2, 5, 7, 8, 9]
    assert summarize(t).samples_per_s == pytest.approx(100.0)


def test_no_perplexity_for_a_run_counting_samples_but_no_tokens() -> None:
    """An image classifier's cross-entropy is no token perplexity."""
    t = _table(step_time_s=[1.0, 1.0, 1.0], loss=[2.3, 2.2, 2.0], samples=[16.0] * 3)
    assert summarize(t).perplexity is None
    t = _table(step_time_s=[1.0, 1.0, 1.0], loss=[2.3, 2.2, 2.0], samples=[16.0] * 3,
               tokens=[512.0] * 3)
    assert summarize(t).perplexity == pytest.approx(math.exp(2.0))
