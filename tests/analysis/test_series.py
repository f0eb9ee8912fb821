"""Per-step series, envelopes and the rank heatmap, on tables with hand-computable numbers."""

from __future__ import annotations

import numpy as np

from stepscope.analysis.series import envelope, phase_stack, rank_heatmap, step_series
from stepscope.schema import StepTable


def _table(ranks: int, steps: int, slow: tuple[int, int] | None = None) -> StepTable:
    r = np.repeat(np.arange(ranks), steps)
    s = np.tile(np.arange(steps), ranks)
    t = np.full(ranks * steps, 0.1)
    if slow:
        t[(r == slow[0]) & (s == slow[1])] = 0.5
    return StepTable.from_columns({"rank": r, "step": s, "step_time_s": t,
                                   "tokens": np.full(ranks * steps, 100.0),
                                   "loss": 5.0 - 0.01 * s + 0.001 * r,
                                   "forward_s": np.full(ranks * steps, 0.03),
                                   "backward_s": np.full(ranks * steps, 0.05)})


def test_job_step_time_is_the_slowest_rank_and_tokens_per_s_counts_every_rank() -> None:
    series = step_series(_table(4, 10, slow=(2, 7)))
    steps, t = series["efficiency/step_time_s"]
    assert steps.tolist() == list(range(10))
    assert t[7] == 0.5 and t[3] == 0.1
    _, tps = series["efficiency/tokens_per_s"]
    assert tps[3] == 400 / 0.1 and tps[7] == 400 / 0.5
    _, loss = series["result/loss"]  # rank 0's, as a script logging on rank 0 shows it
    assert loss[3] == 5.0 - 0.03
    assert len([k for k in series if k.startswith("ranks/")]) == 4


def test_envelope_keeps_a_one_step_spike_that_sampling_would_drop() -> None:
    steps = np.arange(100_000)
    vals = np.full(100_000, 1.0)
    vals[54_321] = 9.0
    s, lo, hi = envelope(steps, vals, max_points=500)
    assert len(s) == 500 and hi.max() == 9.0 and lo.max() == 1.0
    assert s[np.argmax(hi)] <= 54_321 < s[np.argmax(hi) + 1]


def test_heatmap_at_1024_ranks_bins_steps_and_keeps_the_straggler_cell() -> None:
    hm = rank_heatmap(_table(1024, 2000, slow=(777, 1500)), max_cols=600)
    assert hm.values.shape == (1024, 500)  # 2,000 steps at 4 per column
    assert hm.bin_start_steps[:3] == [0, 4, 8]
    row, col = np.unravel_index(np.nanargmax(hm.values), hm.values.shape)
    assert (hm.ranks[row], hm.bin_start_steps[col]) == (777, 1500)
    assert hm.median == 0.1


def test_phase_stack_other_is_what_no_phase_explains() -> None:
    steps, cols = phase_stack(_table(2, 3))
    assert steps.tolist() == [0, 1, 2]
    assert np.allclose(cols["forward_s"], 0.03) and np.allclose(cols["other_s"], 0.02)


def test_a_one_step_spike_in_a_million_points_shows_at_every_zoom_level() -> None:
    from stepscope.analysis.series import series_doc
    from stepscope.analysis.summary import summarize
    from stepscope.schema import RunMeta

    n, spike = 1_000_000, 654_321
    t = np.full(n, 0.2)
    t[spike] = 3.0
    table = StepTable.from_columns({"rank": np.zeros(n, dtype=np.int64),
                                    "step": np.arange(n), "step_time_s": t})
    meta = RunMeta(run_id="big")
    sheet = summarize(table, meta)
    for window in (None, (0, n - 1), (600_000, 700_000), (654_000, 655_000),
                   (654_300, 654_340)):
        doc = series_doc("big", table, sheet, meta, max_points=2000, steps=window)
        line = doc["series"]["efficiency/step_time_s"]
        assert len(line["steps"]) <= 2000, window
        assert max(line["hi"]) == 3.0, window
        i = line["hi"].index(3.0)
        nxt = line["steps"][i + 1] if i + 1 < len(line["steps"]) else n
        assert line["steps"][i] <= spike < nxt, window
