"""Regimes, environment differences and the conditions sampler, on exact numbers.

Step tables are built from exact numbers; the sampler reads a fake /proc written here
(the real /proc is exercised by tests/trust).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stepscope.analysis.compare.runs import _same, normalise
from stepscope.analysis.env_evidence import condition_differences, profiler_steps
from stepscope.analysis.regimes import find_regimes, segment
from stepscope.analysis.summary import summarize
from stepscope.record.conditions import ConditionLog, ConditionSampler
from stepscope.schema import RunMeta, StepTable

JITTER = np.tile([0.98, 1.02], 50)  # +-2%, deterministic


def table(st: np.ndarray, cpu_share: np.ndarray, preempt_rate: np.ndarray,
          tokens: float = 1000.0) -> StepTable:
    n = st.size
    return StepTable.from_columns({
        "rank": np.zeros(n, dtype=int), "step": np.arange(n), "step_time_s": st,
        "tokens": np.full(n, tokens), "cpu_s": st * cpu_share, "preempt": st * preempt_rate,
        "wall_time_s": 1000.0 + np.cumsum(st)})


def test_segment_finds_the_shift_and_leaves_alternation_alone() -> None:
    y = np.r_[np.full(30, 3.0), np.full(30, 0.45)] * JITTER[:60]
    assert segment(y) == [(0, 30), (30, 60)]
    assert segment(np.tile([0.08, 0.12], 30)) == [(0, 60)]
    spike = np.full(60, 0.1) * JITTER[:60]
    spike[20] = 2.0  # one stall is an outlier, not a regime
    assert segment(spike) == [(0, 60)]


def test_busy_then_quiet_is_contention_and_the_headline_is_the_quiet_regime() -> None:
    # Steps 0-69 take 3 s with 0.6 CPU-s per wall-s and 200 preemptions/s; steps 70-149
    # take 0.5 s at 1.0 CPU-s per wall-s and 10 preemptions/s (the field report's run).
    st = np.r_[np.full(70, 3.0), np.full(80, 0.5)] * np.tile([0.98, 1.02], 75)
    t = table(st, np.r_[np.full(70, 0.6), np.full(80, 1.0)],
              np.r_[np.full(70, 200.0), np.full(80, 10.0)])
    regs = find_regimes(t, np.ones(150, dtype=bool))
    assert [(r.first_step, r.last_step, r.cause) for r in regs.regimes] == [
        (0, 69, "contention"), (70, 149, "reference")]
    assert regs.steady == 1
    sheet = summarize(t)
    # 80 steps x 1000 tokens over sum(0.5 x jitter) = 40 s -> 2000 tokens/s exactly
    assert sheet.tokens_per_s == pytest.approx(2000.0)
    assert sheet.steady_regime == "steps 70-149"
    assert "2 regimes" in sheet.notes[-1] and "contention" in sheet.notes[-1]


def test_slower_regime_causes_from_the_cpu_share() -> None:
    quiet = np.full(40, 0.1) * JITTER[:40]
    st = np.r_[quiet, quiet * 2]
    waiting = table(st, np.r_[np.full(40, 1.0), np.full(40, 0.5)], np.full(80, 5.0))
    work = table(st, np.ones(80), np.full(80, 5.0))
    assert [r.cause for r in find_regimes(waiting, np.ones(80, bool)).regimes] == [
        "reference", "waiting"]
    assert [r.cause for r in find_regimes(work, np.ones(80, bool)).regimes] == [
        "reference", "more work"]


def test_throttled_clock_in_the_conditions_is_throttling() -> None:
    st = np.r_[np.full(40, 0.1), np.full(40, 0.15)] * JITTER[:80]
    t = table(st, np.ones(80), np.full(80, 5.0))
    wall = t["wall_time_s"]
    cond = {0: [{"wall_time_s": float(w), "cpu_mhz": 2600.0 if i < 40 else 1800.0}
                for i, w in enumerate(wall)]}
    regs = find_regimes(t, np.ones(80, bool), cond)
    assert regs.regimes[1].cause == "throttling"
    assert "CPU clock 1,800 MHz against 2,600 MHz" in regs.regimes[1].evidence
    assert regs.steady == 0  # the throttled regime is the environment's, not the code's


def _cond(t: StepTable, **values: float) -> dict[int, list[dict[str, Any]]]:
    return {0: [{"wall_time_s": float(w), **values} for w in t["wall_time_s"][::5]]}


def test_condition_differences_need_less_cpu_and_more_queueing() -> None:
    st = np.full(60, 0.1) * JITTER[:60]
    a = table(st, np.ones(60), np.full(60, 5.0))
    b = table(st * 2, np.full(60, 0.5), np.full(60, 5.0))
    quiet, busy = _cond(a, main_oncpu_frac=0.9, main_runq_frac=0.05), \
        _cond(b, main_oncpu_frac=0.45, main_runq_frac=0.5)
    diffs = condition_differences(a, quiet, b, busy)
    assert [(d.name, d.kind) for d in diffs] == [("main_runq_frac", "contention")]
    assert diffs[0].message == ("contention: the training thread of run B ran 45% of the wall "
                                "time against 90% and queued for a CPU 50% of it against 5%")
    # Less CPU but less queueing too: the code sleeps (a slow loader), not the host's doing.
    sleepy = _cond(b, main_oncpu_frac=0.45, main_runq_frac=0.02)
    assert condition_differences(a, quiet, b, sleepy) == []


def test_a_run_shorter_than_the_sampling_interval_is_judged_by_the_sample_covering_it(
        ) -> None:
    """A one-second run A beside a contended B (the real-pair test's failure on a loaded
    CI host): A's steady steps took 0.5 s and no sample was taken inside them; the
    sample taken just after covers them (its interval began before they ended)."""
    st = np.full(60, 0.01) * JITTER[:60]
    a = table(st, np.ones(60), np.full(60, 5.0))
    b = table(st * 6, np.full(60, 0.15), np.full(60, 5.0))
    end = float(a["wall_time_s"][-1])
    after = {0: [{"wall_time_s": end + 0.4, "interval_s": 1.0, "main_oncpu_frac": 0.9,
                  "main_runq_frac": 0.05}]}
    busy = _cond(b, main_oncpu_frac=0.15, main_runq_frac=0.8, interval_s=0.1)
    diffs = condition_differences(a, after, b, busy)
    assert [(d.name, d.a, d.b) for d in diffs] == [("main_runq_frac", 0.05, 0.8)]
    # A sample whose interval began after the window ended says nothing about it.
    later = {0: [{**after[0][0], "interval_s": 0.3}]}
    assert condition_differences(a, later, b, busy) == []


def test_preemptions_count_only_with_less_cpu_in_the_same_run() -> None:
    st = np.full(60, 0.1) * JITTER[:60]
    a = table(st, np.ones(60), np.full(60, 5.0))
    starved = table(st * 2, np.full(60, 0.5), np.full(60, 150.0))
    assert {d.name for d in condition_differences(a, None, starved, None)} == {
        "preempt_per_s", "cpu_per_wall"}
    busy_but_fed = table(st, np.ones(60), np.full(60, 150.0))
    assert condition_differences(a, None, busy_but_fed, None) == []


def _interleaved(own_s: float, cycle_s: float, preempt: np.ndarray) -> StepTable:
    """One of the runs an A/B harness trains in one process, one step of each in turn:
    ``cpu_s`` and ``preempt`` advance between this run's step ends, so each row holds the
    whole cycle's process CPU (1 CPU-s per wall-s) and the preemptions in it."""
    n = preempt.size
    end = np.arange(1, n + 1) * cycle_s
    return StepTable.from_columns({
        "rank": np.zeros(n, dtype=int), "step": np.arange(n),
        "step_time_s": np.full(n, own_s) * JITTER[:n], "end_s": end,
        "wall_time_s": 1000.0 + end, "tokens": np.full(n, 1000.0),
        "cpu_s": np.full(n, cycle_s) * JITTER[:n], "preempt": preempt})


def test_usage_columns_are_rated_over_the_interval_they_cover() -> None:
    # A CI run of the A/B harness: the fast run's steps take 1.5 ms, the slow run's 6 ms
    # (its loader sleeps); each row's usage covers the same 12 ms cycle of five runs, with
    # 0 or 1 preemption in it (the slow run's median 1, the fast one's 0). Over each step's
    # own time the slow run looked preempted 167/s against 0 with a quarter of the CPU per
    # wall-second: "conditions differ". Over the cycle both got the process's CPU alike.
    fast = _interleaved(0.0015, 0.012, np.tile([0.0, 0.0, 1.0], 20))
    slow = _interleaved(0.006, 0.012, np.tile([1.0, 1.0, 0.0], 20))
    assert condition_differences(fast, None, slow, None) == []
    # A run whose usage really covers less CPU per wall-second and more preemptions is
    # still contention, with the rates over the cycle (not the step time) in the message.
    starved = _interleaved(0.006, 0.012, np.full(60, 2.0))
    starved = StepTable.from_columns({**{c: starved[c] for c in starved.columns},
                                      "cpu_s": np.full(60, 0.006) * JITTER[:60]})
    diffs = condition_differences(fast, None, starved, None)
    assert [d.name for d in diffs] == ["preempt_per_s", "cpu_per_wall"]
    assert diffs[0].b == pytest.approx(2 / 0.012) and diffs[1].b == pytest.approx(0.5, rel=0.03)


def test_baseline_values_compare_after_normalisation() -> None:
    assert normalise("AdamW") == "adamw" and _same("AdamW", "adamw")
    assert _same("bfloat16", "bf16") and _same("torch.float32", "FP32")
    assert not _same("adamw", "sgd")


def test_profiler_window_from_run_json_and_events() -> None:
    meta = RunMeta(run_id="r", config={"profile_steps": "10:13"})
    assert profiler_steps(meta) == (10, 13)
    assert profiler_steps(RunMeta(run_id="r"), [{"type": "profile", "steps": [4, 6]}]) == (4, 7)
    assert profiler_steps(RunMeta(run_id="r")) is None


def _fake_proc(root: Path, cpu: list[int], own_ns: tuple[int, int]) -> None:
    (root / "self").mkdir(parents=True, exist_ok=True)
    (root / "stat").write_text("cpu  " + " ".join(map(str, cpu)) + "\nprocs_running 3\n")
    (root / "loadavg").write_text("2.50 1.00 0.50 3/100 999\n")
    (root / "cpuinfo").write_text("cpu MHz\t\t: 2000.0\ncpu MHz\t\t: 3000.0\n")
    (root / "self" / "schedstat").write_text(f"{own_ns[0]} {own_ns[1]} 7\n")


def test_sampler_shares_over_the_interval(tmp_path: Path) -> None:
    clock = iter([0.0, 2.0])
    own = iter([1.0, 2.5])
    s = ConditionSampler(proc=tmp_path, sys=tmp_path / "nosys", nvml=False,
                         clock=lambda: next(clock), wall_clock=lambda: 5.0,
                         own_cpu_s=lambda: next(own), ncpu=lambda: 2)
    # user nice system idle iowait irq softirq steal (ticks)
    _fake_proc(tmp_path, [100, 0, 0, 100, 0, 0, 0, 0], (0, 0))
    first = s.sample()
    assert first == {"wall_time_s": 5.0, "ncpu": 2.0, "procs_running": 3.0, "load_1m": 2.5,
                     "cpu_mhz": 2500.0}
    # +300 busy, +60 idle, +20 iowait, +20 steal ticks; main thread 1.5 s on CPU and
    # 0.4 s queued over the 2 s interval
    _fake_proc(tmp_path, [400, 0, 0, 160, 20, 0, 0, 20], (1_500_000_000, 400_000_000))
    rec = s.sample()
    assert rec["host_busy_frac"] == pytest.approx(300 / 400)
    assert rec["host_steal_frac"] == pytest.approx(20 / 400)
    assert rec["host_iowait_frac"] == pytest.approx(20 / 400)
    assert rec["proc_cpu_cores"] == pytest.approx(0.75)  # 1.5 CPU-s over 2 s
    assert rec["others_cpu_cores"] == pytest.approx(0.75 * 2 - 0.75)
    assert "main_oncpu_frac" not in first  # nothing to difference yet
    assert (rec["main_oncpu_frac"], rec["main_runq_frac"]) == pytest.approx((0.75, 0.2))


def test_condition_log_rate_limits_and_never_raises(tmp_path: Path) -> None:
    now = [0.0]

    class Broken(ConditionSampler):
        def sample(self) -> dict[str, float]:
            raise OSError("proc is gone")

    log = ConditionLog(tmp_path / "c.jsonl", ConditionSampler(nvml=False),
                       min_interval_s=1.0, clock=lambda: now[0])
    log.tick()
    now[0] = 0.5
    log.tick()  # inside the interval: skipped
    now[0] = 1.2
    log.tick()
    now[0] = 1.5
    log.close()  # 0.3 s after the last sample: written
    assert (tmp_path / "c.jsonl").read_bytes().count(b"\n") == 3
    again = ConditionLog(tmp_path / "e.jsonl", ConditionSampler(nvml=False),
                         clock=lambda: now[0])
    again.tick()
    again.close()  # no time since the last sample: its shares would be tick rounding
    assert (tmp_path / "e.jsonl").read_bytes().count(b"\n") == 1
    broken = ConditionLog(tmp_path / "d.jsonl", Broken(nvml=False))
    with pytest.warns(RuntimeWarning, match="condition sampling stopped"):
        broken.tick()
    broken.tick()  # stopped: silent from now on
    broken.close()
