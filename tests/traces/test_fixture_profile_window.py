"""The trace `stepscope run --profile-steps 3:5` captured (tests/data/kineto-cpu-profile-window):
the capture holds exactly the two profiled steps, and the breakdown finds their backward
(autograd events) and no communication on this single-process run."""

from __future__ import annotations

from pathlib import Path

from stepscope.analysis.trace.breakdown import analyze
from stepscope.traces import read_trace

TRACE = Path(__file__).resolve().parents[1] / "data" / "kineto-cpu-profile-window"


def test_profile_window_capture_holds_the_profiled_steps_only() -> None:
    report = analyze(read_trace(TRACE))
    (rank,) = report.ranks.values()
    assert [s.step for s in rank.steps] == [3, 4]
    for s in rank.steps:
        assert s.backward_us > 0 and s.backward_source == "autograd events"
        assert s.comm_us == 0.0
        parts = (s.data_us + s.forward_us + s.backward_us + s.comm_exposed_us + s.optimizer_us
                 + s.other_us + s.idle_us)
        assert abs(parts - s.step_time_us) <= 1e-6 * s.step_time_us
    assert "no communication found" in rank.no_comm_note
