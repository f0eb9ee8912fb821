"""The cross-rank side channel: files in the run directory, no collective, no waiting.

The gather once was a collective keyed on each rank's step count; with uneven
inputs one rank waited in it forever. These pin the exchange with real run directories.
"""

from __future__ import annotations

import math
from pathlib import Path

from stepscope.record.crossrank import FileExchange, cross_rank_event
from stepscope.rundir.store import RunDir
from stepscope.schema import RunMeta

NAMES = ("step_time_s", "compute_s")


def _event(step: int, rows: dict[int, list[float]]) -> dict[str, object]:
    return cross_rank_event(step, NAMES, rows, "compute_s")


def _exchanges(tmp_path: Path, world: int) -> tuple[RunDir, list[FileExchange]]:
    run = RunDir.create(tmp_path / "run", RunMeta(run_id="run"))
    return run, [FileExchange(RunDir(run.path), r, world, _event, max_lag_steps=40,
                              settle_s=0.0, wall_clock=lambda: 1.0) for r in range(world)]


def test_ranks_at_different_steps_never_wait_and_rank0_merges_what_is_there(
        tmp_path: Path) -> None:
    run, (x0, x1, x2) = _exchanges(tmp_path, 3)
    assert x1(19, [1.0, 0.5]) is None  # rank 1 publishes and returns at once: no view yet
    x2(1000, [1.0, 0.5])  # rank 2 is far ahead (or its file is from long ago): stale
    x0(39, [1.0, 1.0])
    x0.join()
    events, _ = run.read_events(type="cross_rank")
    assert len(events) == 1
    ev = events[0]
    assert ev["step"] == 39 and ev["ranks"] == 2 and ev["stale_ranks"] == [2]
    assert ev["straggler_scores"] == {"0": 0.5, "1": 1.0}  # fastest 0.5 / own
    assert ev["stragglers"] == [0] and ev["missing_ranks"] == []
    view = x1(39, [1.0, 0.5])  # the next exchange of rank 1 reads rank 0's merged view
    assert view is not None and view["straggler_scores"]["1"] == 1.0


def test_with_one_rank_in_range_the_view_is_skipped_and_says_why(tmp_path: Path) -> None:
    run, (x0, _x1) = _exchanges(tmp_path, 2)
    x0(19, [1.0, 1.0])
    x0.join()
    assert run.read_events(type="cross_rank")[0] == []
    view = run.cross_view()
    assert view is not None and "1 rank(s) within 40 steps" in view["skipped"]
    assert view["missing_ranks"] == [1]


def test_a_corrupt_rank_file_is_skipped(tmp_path: Path) -> None:
    run, (x0, x1, _x2) = _exchanges(tmp_path, 3)
    x1(19, [2.0, math.nan])
    (run.path / "crossrank" / "rank-00002.json").write_bytes(b"{torn")
    x0(19, [2.0, 1.0])
    x0.join()
    ev = run.read_events(type="cross_rank")[0][0]
    assert ev["ranks"] == 2 and ev["missing_ranks"] == [2]
    assert ev["straggler_scores"] == {"0": 1.0}  # rank 1's NaN compute time is not scored
    assert not list((run.path / "crossrank").glob(".*.tmp"))


def test_rank0_waits_on_its_own_thread_for_peers_of_the_same_step(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", RunMeta(run_id="run"))

    def event(step: int, rows: dict[int, list[float]]) -> dict[str, object]:
        return {**_event(step, rows), "comm_wait_s": {"0": 0.1, "1": 0.0}}

    x0, x1 = (FileExchange(RunDir(run.path), r, 2, event, max_lag_steps=40,
                           aligned_only=("comm_wait_s",), settle_s=30.0) for r in range(2))
    x1(0, [1.0, 2.0])
    assert x0(19, [1.0, 1.0]) is None  # returns at once; the merge waits for rank 1
    x1(19, [1.0, 2.0])  # rank 1 reaches step 19 a moment later
    x0.join(30)
    ev = run.read_events(type="cross_rank")[0][-1]
    assert ev["step"] == 19 and ev["aligned"] is True and ev["rank_steps"] == {"0": 19, "1": 19}
    assert ev["comm_wait_s"] == {"0": 0.1, "1": 0.0}
    x1(39, [1.0, 2.0])  # rank 1 first this time: no wait needed
    x0.settle_s = 0.0
    x0(39, [1.0, 1.0])
    x0.join()
    ev = run.read_events(type="cross_rank")[0][-1]
    assert ev["step"] == 39 and ev["aligned"] is True
    x1(199, [1.0, 2.0])  # now rank 1 has neither step 59 nor a window within 40 steps
    x0(59, [1.0, 1.0])
    x0.join()
    view = run.cross_view()
    assert view is not None and view["stale_ranks"] == [1] and "skipped" in view


def test_unaligned_view_drops_per_step_comparisons(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "run", RunMeta(run_id="run"))

    def event(step: int, rows: dict[int, list[float]]) -> dict[str, object]:
        return {**_event(step, rows), "comm_wait_s": {"0": 0.1, "1": 0.0}}

    x0, x1 = (FileExchange(RunDir(run.path), r, 2, event, max_lag_steps=40,
                           aligned_only=("comm_wait_s",), settle_s=0.0) for r in range(2))
    x1(9, [1.0, 2.0])  # rank 1 ran out of batches at step 9 (uneven inputs)
    x0(19, [1.0, 1.0])
    x0.join()
    ev = run.read_events(type="cross_rank")[0][-1]
    assert ev["aligned"] is False and "comm_wait_s" not in ev
    assert ev["rank_steps"] == {"0": 19, "1": 9}
