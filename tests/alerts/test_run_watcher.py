"""RunWatcher over a run directory written the way the recorder writes it: rules on new
records, a frozen rank, a process gone, a job that never wrote a step, the end of a run."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from stepscope.alerts.config import RulesConfig
from stepscope.alerts.follow import RunWatcher, pid_state
from stepscope.rundir.store import RunDir, StepFileWriter
from stepscope.schema import RunMeta


def _run(tmp_path: Path, pid: int = 4242) -> tuple[RunDir, StepFileWriter]:
    run = RunDir.create(tmp_path / "r", RunMeta(run_id="r1", name="exp"))
    run.append_event({"type": "process", "rank": 0, "pid": pid,
                      "hostname": socket.gethostname()})
    return run, StepFileWriter(run.steps_path(0))


def _steps(w: StepFileWriter, start: int, n: int, st: float) -> None:
    w.write([{"rank": 0, "step": i, "step_time_s": st, "tokens": 100.0}
             for i in range(start, start + n)])


def test_rules_fire_on_appended_records_and_torn_lines_wait(tmp_path: Path) -> None:
    run, w = _run(tmp_path)
    watcher = RunWatcher(run, RulesConfig(), stall_after_s=60.0, state_of=lambda p: "S")
    _steps(w, 0, 30, 0.1)
    assert watcher.poll(0.0, 0.0) == []
    with open(run.steps_path(0), "ab") as f:  # a torn last line: half a record
        f.write(b'{"rank": 0, "step": 30, "step_ti')
    assert watcher.poll(1.0, 1.0) == []
    with open(run.steps_path(0), "ab") as f:
        f.write(b'me_s": 0.5}\n')
    _steps(w, 31, 2, 0.5)
    alerts = watcher.poll(2.0, 2.0)
    assert [(a.rule, a.step, a.run) for a in alerts] == [("step_time", 32, "exp")]


def test_frozen_process_is_reported_once_with_its_state(tmp_path: Path) -> None:
    run, w = _run(tmp_path)
    watcher = RunWatcher(run, RulesConfig(), stall_after_s=5.0, state_of=lambda p: "T")
    _steps(w, 0, 10, 0.1)
    assert watcher.poll(0.0, 0.0) == []
    assert watcher.poll(4.0, 4.0) == []
    [alert] = watcher.poll(6.0, 6.0)
    assert alert.rule == "frozen" and alert.severity == "critical" and alert.step == 9
    assert "stopped (SIGSTOP" in alert.message and "4242" in alert.message
    assert watcher.poll(20.0, 20.0) == []  # once per stall
    _steps(w, 10, 1, 0.1)
    assert watcher.poll(21.0, 21.0) == []
    assert [a.rule for a in watcher.poll(27.0, 27.0)] == ["frozen"]  # a new stall


def test_gone_process_is_reported_after_the_grace_and_ends_the_watch(tmp_path: Path) -> None:
    run, w = _run(tmp_path)
    watcher = RunWatcher(run, RulesConfig(), stall_after_s=600.0, state_of=lambda p: None)
    _steps(w, 0, 3, 0.1)
    assert watcher.poll(0.0, 0.0) == [] and not watcher.done
    [alert] = watcher.poll(6.0, 6.0)
    assert alert.rule == "process_gone" and "4242" in alert.message
    assert watcher.done


def test_finished_run_ends_the_watch_without_alerts(tmp_path: Path) -> None:
    run, w = _run(tmp_path)
    watcher = RunWatcher(run, RulesConfig(), stall_after_s=1.0, state_of=lambda p: None)
    _steps(w, 0, 3, 0.1)
    run.update_meta(status="finished")
    assert watcher.poll(100.0, 100.0) == [] and watcher.done and watcher.status == "finished"


def test_job_that_never_writes_a_step_is_reported(tmp_path: Path) -> None:
    run = RunDir.create(tmp_path / "r", RunMeta(run_id="r1"))
    watcher = RunWatcher(run, RulesConfig(), stall_after_s=10.0)
    assert watcher.poll(0.0, 0.0) == []
    [alert] = watcher.poll(11.0, 11.0)
    assert alert.rule == "no_steps" and alert.rank is None


def test_pid_state_reads_this_process_and_a_gone_one() -> None:
    assert pid_state(os.getpid()) in ("R", "S")
    assert pid_state(2**22 + 12345) is None


def test_a_rank_slow_in_m_gathers_is_reported_as_a_straggler(tmp_path: Path) -> None:
    from stepscope.record.crossrank import cross_rank_event

    run, w = _run(tmp_path)
    watcher = RunWatcher(run, RulesConfig(), stall_after_s=600.0, state_of=lambda p: "S")
    names = ["compute_s"]
    fast_slow = [[0.10], [0.10], [0.30]]
    run.append_event(cross_rank_event(20, names, fast_slow, "compute_s"))
    assert watcher.poll(0.0, 0.0) == []
    run.append_event(cross_rank_event(40, names, fast_slow, "compute_s"))
    run.append_event(cross_rank_event(60, names, fast_slow, "compute_s"))
    [alert] = watcher.poll(1.0, 1.0)  # M = RulesConfig.consecutive = 3 gathers
    assert (alert.rule, alert.rank, alert.step) == ("straggler", 2, 60)
    assert alert.message == ("rank 2 is a straggler in 3 gathers in a row: score 0.33, below "
                             "0.8 (compute_s 0.3 s per step against the reference rank's "
                             "0.1 s)")


def test_watch_on_a_root_follows_every_run_in_it(tmp_path: Path) -> None:
    from stepscope.alerts.config import AlertsConfig
    from stepscope.alerts.watch import find_runs, watch_path

    done = RunDir.create(tmp_path / "a" / "done", RunMeta(run_id="done", status="finished"))
    idle = RunDir.create(tmp_path / "b", RunMeta(run_id="idle"))
    assert find_runs(tmp_path) == [done.path, idle.path]
    seen = []
    code = watch_path(tmp_path, AlertsConfig(), stall_after_s=0.3, emit=seen.append,
                      poll_s=0.05, max_s=2.0)
    assert code == 0
    assert [(a.rule, a.run) for a in seen] == [("no_steps", "idle")]
    events, _ = idle.read_events(type="alert")
    assert [(e["rule"], e["observer"]) for e in events] == [("no_steps", "watch")]


def test_watch_reads_the_condition_samples_for_the_environment_rules(tmp_path: Path) -> None:
    run, w = _run(tmp_path)
    cond = StepFileWriter(run.conditions_path(0))
    watcher = RunWatcher(run, RulesConfig(step_time_factor=100.0), stall_after_s=600.0,
                         state_of=lambda p: "S")
    quiet = {"main_oncpu_frac": 0.97, "main_runq_frac": 0.01}
    cond.write([quiet])
    w.write([{"rank": 0, "step": i, "step_time_s": 0.1, "cpu_s": 0.098, "preempt": 1.0}
             for i in range(30)])
    assert watcher.poll(0.0, 0.0) == []
    cond.write([{"main_oncpu_frac": 0.25, "main_runq_frac": 0.7}] * 2)
    w.write([{"rank": 0, "step": i, "step_time_s": 0.3, "cpu_s": 0.075, "preempt": 60.0}
             for i in range(30, 40)])
    [alert] = watcher.poll(1.0, 1.0)
    assert (alert.rule, alert.step) == ("contention", 34)
    assert "waited for a CPU 70% of it against 1%" in alert.message
