"""Breakdown math on hand-made traces: every number below is computed by hand from
tests/support/traces.cpu_step_events (one 100 µs step)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from stepscope.analysis.trace import intervals as iv
from stepscope.analysis.trace.breakdown import NO_COMM_MESSAGE, analyze, parse_steps
from stepscope.analysis.trace.diff import diff_reports
from stepscope.errors import ConfigError
from stepscope.traces import read_trace
from support.traces import cpu_step_events, ev, thread_name, write_trace


def test_interval_set_arithmetic() -> None:
    a = iv.union(np.array([0.0, 5.0, 2.0, 9.0]), np.array([3.0, 6.0, 4.0, 9.0]))
    assert [x.tolist() for x in a] == [[0.0, 5.0], [4.0, 6.0]]
    b = iv.union(np.array([3.0]), np.array([5.5]))
    assert [x.tolist() for x in iv.intersect(a, b)] == [[3.0, 5.0], [4.0, 5.5]]
    assert [x.tolist() for x in iv.subtract(a, b)] == [[0.0, 5.5], [3.0, 6.0]]
    assert [x.tolist() for x in iv.clip(a, 1.0, 5.2)] == [[1.0, 5.0], [4.0, 5.2]]
    assert iv.total(iv.intersect(a, (np.array([4.0]), np.array([5.0])))) == 0.0  # touching


def _cpu_trace(tmp_path: Path, steps: int = 1, rank: int = 0) -> Path:
    events = [thread_name(2, "thread 2 (pt_gloo_runloop)"), thread_name(2, "python3")]
    for k in range(steps):
        events += cpu_step_events(offset=100.0 * k, step=k + 1)
    return write_trace(tmp_path / f"rank{rank}.pt.trace.json", events, rank=rank)


def test_step_split_adds_up_and_matches_hand_numbers(tmp_path: Path) -> None:
    report = analyze(read_trace(_cpu_trace(tmp_path)))
    (row,) = report.ranks[0].steps
    got = {k: v for k, v in row.to_dict().items() if k.endswith("_us") and k != "start_us"}
    assert got == {"step_time_us": 100.0, "data_us": 10.0, "forward_us": 30.0,
                   "backward_us": 40.0, "comm_exposed_us": 5.0, "optimizer_us": 10.0,
                   "other_us": 0.0, "idle_us": 5.0, "comm_us": 30.0,
                   "comm_overlapped_us": 25.0, "compute_us": 80.0, "no_activity_us": 5.0}
    rank = report.to_dict()["ranks"]["0"]
    assert (rank["view"], rank["window_us"], rank["idle_us"], rank["compute_us"],
            rank["non_compute_us"], rank["comm_us"], rank["comm_overlap_us"]) == (
        "host", 100.0, 5.0, 80.0, 15.0, 30.0, 25.0)
    assert rank["comm_comp_overlap_pct"] == 83.33
    assert report.warnings == []


def test_no_comm_says_so_instead_of_zero(tmp_path: Path) -> None:
    events = [e for e in cpu_step_events() if not e["name"].startswith("gloo")]
    report = analyze(read_trace(write_trace(tmp_path / "t.json", events)))
    rank = report.to_dict()["ranks"]["0"]
    assert rank["comm_comp_overlap_pct"] is None
    assert rank["comm_note"] == NO_COMM_MESSAGE
    assert NO_COMM_MESSAGE.startswith("no communication found (looked for: ")
    assert f"rank 0: {NO_COMM_MESSAGE}" in report.warnings


def test_backward_inferred_from_autograd_when_not_annotated(tmp_path: Path) -> None:
    events = [e for e in cpu_step_events() if e["name"] != "stepscope.backward"]
    events.append(ev("autograd::engine::evaluate_function: MmBackward0", 45, 20))
    (row,) = analyze(read_trace(write_trace(tmp_path / "t.json", events))).ranks[0].steps
    assert (row.backward_us, row.backward_source) == (20.0, "autograd events")


def test_steps_selection_and_bad_spec(tmp_path: Path) -> None:
    tables = read_trace(_cpu_trace(tmp_path, steps=4))
    assert [r.step for r in analyze(tables, steps=(2, 3)).ranks[0].steps] == [2, 3]
    assert [r.step for r in analyze(tables, steps=parse_steps("3:")).ranks[0].steps] == [3, 4]
    assert parse_steps(":2") == (None, 2) and parse_steps("5") == (5, 5)
    with pytest.raises(ConfigError, match="expected 'a:b'"):
        parse_steps("x:y")


def test_slowest_rank_and_the_phase_that_differs(tmp_path: Path) -> None:
    fast = _cpu_trace(tmp_path, rank=0)
    slow_events = [thread_name(2, "pt_gloo_runloop")] + cpu_step_events()
    for e in slow_events:  # rank 1: forward 20 µs longer, the step too
        if e["name"] == "ProfilerStep#1":
            e["dur"] = 120
        if e["name"] in ("stepscope.forward", "aten::mm"):
            e["dur"] = 50
        elif e.get("ts", 0) >= 40 and e["ph"] == "X" and not e["name"].startswith("Profiler"):
            e["ts"] += 20
    slow = write_trace(tmp_path / "rank1.pt.trace.json", slow_events, rank=1)
    c = analyze(read_trace([fast, slow])).comparison
    assert c is not None
    assert (c.slowest_rank, c.fastest_rank, c.slower_by_pct) == (1, 0, 20.0)
    assert (c.straggler_rank, c.differing_phase, c.phase_delta_us) == (1, "forward", 20.0)
    # working time (step - exposed comm - idle) 90 vs 110 µs, health.config.straggler_scores:
    # 0.82, above the one threshold 0.8, so diagnose calls no straggler
    assert c.straggler_score == pytest.approx(90 / 110)


def test_diff_of_two_traces(tmp_path: Path) -> None:
    a = analyze(read_trace(_cpu_trace(tmp_path / "a" if (tmp_path / "a").mkdir() is None
                                      else tmp_path)))
    events = cpu_step_events()
    for e in events:
        if e["name"] == "aten::mm":
            e["name"] = "aten::matmul"  # removed mm, added matmul
        if e["name"] == "aten::mm_backward":
            e["dur"] = 20.0  # faster (self time halves)
    (tmp_path / "b").mkdir()
    b = analyze(read_trace(write_trace(tmp_path / "b" / "t.json", events)))
    d = diff_reports(a, b)
    status = {o.name: (o.status, o.delta_us_per_step) for o in d.ops}
    assert status == {"aten::mm": ("removed", -30.0), "aten::matmul": ("added", 30.0),
                      "aten::mm_backward": ("faster", -20.0), "aten::add_": ("same", 0.0)}
    assert {p.phase: p.status for p in d.phases}["data"] == "same"
