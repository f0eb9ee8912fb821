"""Recorder: exact numbers with an injected clock; never raises into training."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from stepscope import Recorder, RunDir
from stepscope.rundir.store import StepFileWriter


class FakeClock:
    """A clock that advances only when told to: tests get exact durations."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def tick(self, dt: float) -> None:
        self.t += dt


def test_phases_data_wait_and_step_time_are_exact(tmp_path: Path) -> None:
    clk = FakeClock()
    rec = Recorder(tmp_path / "run", clock=clk, wall_clock=lambda: 5.0, background=False)

    def loader():  # each batch takes 0.25 s to produce
        for i in range(2):
            clk.tick(0.25)
            yield i

    for _ in rec.wrap_loader(loader()):
        with rec.step(tokens=512, samples=2) as s:
            with s.phase("forward"):
                clk.tick(0.5)
            with s.phase("backward"):
                clk.tick(1.0)
            with s.phase("optimizer"):
                clk.tick(0.125)
            with s.phase("forward"):  # a phase entered twice accumulates
                clk.tick(0.5)
            s.log(loss=2.5, lr=1e-3, my_metric=7)
    rec.close()
    table, stats = RunDir.open(tmp_path / "run").read_steps()
    assert stats.skipped == 0
    assert table["step"].tolist() == [0, 1]
    assert table["step_time_s"].tolist() == [2.375, 2.375]
    assert table["data_wait_s"].tolist() == [0.25, 0.25]
    assert table["forward_s"].tolist() == [1.0, 1.0]
    assert table["backward_s"].tolist() == [1.0, 1.0]
    assert table["optimizer_s"].tolist() == [0.125, 0.125]
    assert table["tokens"].tolist() == [512.0, 512.0]
    assert table["loss"].tolist() == [2.5, 2.5] and table["my_metric"].tolist() == [7.0, 7.0]
    assert table["end_s"].tolist() == [2.375, 4.75]
    assert table["wall_time_s"].tolist() == [5.0, 5.0]
    assert table["synced"].tolist() == [0.0, 0.0]
    assert RunDir(tmp_path / "run").read_meta().status == "finished"


def test_data_wait_inside_a_step_is_not_counted_twice(tmp_path: Path) -> None:
    clk = FakeClock()
    rec = Recorder(tmp_path / "run", clock=clk, background=False)
    with rec.step():
        clk.tick(0.5)
        rec.add_time("data_wait", 0.5)  # e.g. next() called inside the step
        clk.tick(1.0)
    rec.close()
    table, _ = RunDir.open(tmp_path / "run").read_steps()
    assert table["step_time_s"].tolist() == [1.5] and table["data_wait_s"].tolist() == [0.5]


def test_sync_only_on_sampled_steps_with_phases(tmp_path: Path) -> None:
    clk = FakeClock()
    calls: list[int] = []
    rec = Recorder(tmp_path / "run", clock=clk, sync=lambda: calls.append(1),
                   sync_every=3, background=False)
    for i in range(6):
        with rec.step() as s:
            with s.phase("forward"):
                clk.tick(0.1)
        if i == 0:
            assert len(calls) == 3  # phase enter, phase exit, step end
    rec.close()
    table, _ = RunDir.open(tmp_path / "run").read_steps()
    assert table["synced"].tolist() == [1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    assert len(calls) == 6


def test_failing_sync_is_dropped_not_raised(tmp_path: Path) -> None:
    def bad_sync() -> None:
        raise RuntimeError("device lost")

    rec = Recorder(tmp_path / "run", sync=bad_sync, sync_every=1, background=False)
    for _ in range(3):
        with rec.step() as s, s.phase("forward"):
            pass
    rec.close()
    table, _ = RunDir.open(tmp_path / "run").read_steps()
    assert len(table) == 3


def test_log_after_step_goes_to_that_step(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "run", background=False)
    with rec.step():
        pass
    rec.log(loss=1.25)  # e.g. a callback that fires after the step
    with rec.step():
        pass
    rec.close()
    table, _ = RunDir.open(tmp_path / "run").read_steps()
    assert table["loss"][0] == 1.25 and math.isnan(table["loss"][1])


def test_exception_marks_run_failed(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        with Recorder(tmp_path / "run") as rec:
            with rec.step():
                pass
            raise ValueError("boom")
    meta = RunDir.open(tmp_path / "run").read_meta()
    assert meta.status == "failed" and meta.error == "ValueError: boom"


# A script that leaves `with Recorder(...)` the way argv[2] says, after two steps.
_EXIT_CHILD = textwrap.dedent("""
    import sys
    from stepscope import Recorder
    how = sys.argv[2]
    with Recorder(sys.argv[1]) as rec:
        for _ in range(2):
            with rec.step(tokens=1):
                pass
        if how == "exit0":
            sys.exit(0)
        if how == "none":
            raise SystemExit(None)
        if how == "exit3":
            sys.exit(3)
        if how == "interrupt":
            raise KeyboardInterrupt
        raise ValueError("boom")
""")


@pytest.mark.parametrize(("how", "rc", "status", "error"), [
    ("exit0", 0, "finished", None),
    ("none", 0, "finished", None),
    ("exit3", 3, "failed", "SystemExit: 3"),
    ("interrupt", -signal.SIGINT, "failed", "KeyboardInterrupt"),
    ("raise", 1, "failed", "ValueError: boom"),
])
def test_leaving_the_recorder_records_what_the_exit_status_says(
        tmp_path: Path, how: str, rc: int, status: str, error: str | None) -> None:
    run = tmp_path / "run"
    res = subprocess.run([sys.executable, "-c", _EXIT_CHILD, str(run), how],
                         capture_output=True, text=True, timeout=120)
    # Python >= 3.8 dies of SIGINT after an uncaught KeyboardInterrupt.
    assert res.returncode in (rc, 130 if rc == -signal.SIGINT else rc), res.stderr
    meta = RunDir.open(run).read_meta()
    assert (meta.status, meta.error) == (status, error)
    table, _ = RunDir.open(run).read_steps()
    assert len(table) == 2


def test_full_disk_warns_once_and_training_continues(tmp_path: Path) -> None:
    # /dev/full is a real device whose writes fail with ENOSPC, as on a full disk.
    if not os.path.exists("/dev/full"):
        pytest.skip("/dev/full is not available")
    writer = StepFileWriter(Path("/dev/full"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            assert writer.write([{"rank": 0, "step": 1}]) == 0
    assert len([w for w in caught if "cannot write step records" in str(w.message)]) == 1
    assert writer.dropped == 3


def test_unwritable_run_directory_does_not_stop_training(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "run")
    # Replace the steps directory by a file: every later write fails with an OSError.
    steps_dir = tmp_path / "run" / "steps"
    for f in steps_dir.iterdir():
        f.unlink()
    steps_dir.rmdir()
    steps_dir.write_text("not a directory")
    rec._queue._file.close()  # drop the open file: the next write reopens and fails
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(50):
            with rec.step(tokens=1):
                pass
        rec.close()
    assert any("training continues" in str(w.message) for w in caught)
    assert rec.dropped == 50


_KILL_CHILD = textwrap.dedent("""
    import sys, time
    from stepscope import Recorder
    rec = Recorder(sys.argv[1], flush_interval_s=0.5)
    i = 0
    while True:
        with rec.step(tokens=1):
            time.sleep(0.005)
        print(i, time.time(), flush=True)
        i += 1
""")


def test_sigkill_loses_at_most_the_last_second(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-c", _KILL_CHILD, str(run)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    last = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # let it run past a few flushes
        line = proc.stdout.readline()
        last = line.split()
        if int(last[0]) >= 300:
            break
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert last is not None
    table, stats = RunDir.open(run).read_steps()
    assert len(table) > 0 and stats.skipped <= 1
    # Records written by the child up to its last printed step, minus at most ~1 s
    # (one flush interval plus scheduling slack on a loaded machine).
    assert table["wall_time_s"].max() >= float(last[1]) - 1.5
    assert table["step"].tolist() == list(range(len(table)))


def test_tool_time_between_steps_is_attributed_not_lost(tmp_path: Path) -> None:
    """stepscope's own overhead (e.g. a profiler stop) between steps goes to tool_s."""
    clk = FakeClock()
    rec = Recorder(tmp_path / "run", clock=clk, background=False)
    with rec.step():
        clk.tick(1.0)
    clk.tick(2.0)
    rec.add_time("tool", 2.0)
    with rec.step():
        clk.tick(1.0)
    rec.close()
    table, _ = RunDir.open(tmp_path / "run").read_steps()
    assert table["step_time_s"].tolist() == [1.0, 3.0]
    assert math.isnan(table["tool_s"][0]) and table["tool_s"][1] == 2.0
    assert table["end_s"].tolist() == [1.0, 4.0]


def test_rows_to_records_keeps_only_recorded_slots() -> None:
    from stepscope.record.records import UNSET, rows_to_records

    names = ["rank", "step", "step_time_s", "loss", "lr", "my_metric"]
    nan = float("nan")
    rows = [[0, 0, 0.5, 2.0, UNSET, UNSET], [0, 1, 0.25, nan, nan, nan],
            [0, 2, 0.25, float("-inf"), 1e-3, 1.0], [1, 0, "bad", 1.0, UNSET, UNSET]]
    assert rows_to_records(rows, names) == [
        {"rank": 0, "step": 0, "step_time_s": 0.5, "loss": 2.0},
        # a NaN loss or user metric is a NaN; a NaN lr only means "not known"
        {"rank": 0, "step": 1, "step_time_s": 0.25, "loss": "NaN", "my_metric": "NaN"},
        {"rank": 0, "step": 2, "step_time_s": 0.25, "loss": "-Infinity", "lr": 1e-3,
         "my_metric": 1.0},
        {"rank": 1, "step": 0, "loss": 1.0},  # a value that is not a number: not recorded
    ]
    assert rows_to_records([], names) == []


def test_unknown_passed_as_nan_is_not_recorded_as_a_nan(tmp_path: Path) -> None:
    """Adapters pass NaN for "could not count": only loss-like columns keep a NaN."""
    nan = float("nan")
    rec = Recorder(tmp_path / "run", background=False)
    for _ in range(2):
        with rec.step(tokens=nan, samples=nan) as s:
            s.log(lr=nan, loss_scale=nan, mem_peak_bytes=nan, loss=1.0)
    rec.log(lr=nan, grad_norm=nan)  # late record: grad_norm NaN is real, lr NaN is unknown
    rec.close()
    raw = (tmp_path / "run" / "steps" / "rank-00000.jsonl").read_text()
    assert raw.count('"NaN"') == 1 and '"grad_norm":"NaN"' in raw
    table, _ = RunDir.open(tmp_path / "run").read_steps()
    assert not [c for c in table.columns if c.endswith("_nan") and c != "grad_norm_nan"]
    assert table["grad_norm_nan"].tolist() == [0.0, 1.0]
    assert not table.has_data("tokens") and not table.has_data("lr")


def test_record_step_writes_the_measured_numbers_as_given(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "run", clock=FakeClock(), background=False, no_usage=True)
    step = rec.record_step(101.0, 101.75, wall_end_s=7.0, tokens=4096, samples=8,
                           phases={"data_wait": 0.125, "forward": 0.25, "backward": 0.25,
                                   "optimizer": 0.0625, "tool": 0.03125, "fetch": 0.5},
                           values={"loss": 2.5, "lr": 1e-3, "grad_norm": 0.75,
                                   "accuracy": 0.5})
    assert step == 0
    rec.close()
    table, _ = RunDir.open(tmp_path / "run").read_steps()
    row = {k: table[k].tolist()[0] for k in (
        "rank", "step", "step_time_s", "end_s", "wall_time_s", "tokens", "samples",
        "data_wait_s", "forward_s", "backward_s", "optimizer_s", "tool_s", "fetch_s",
        "loss", "lr", "grad_norm", "accuracy", "synced")}
    assert row == {"rank": 0, "step": 0, "step_time_s": 0.75, "end_s": 1.75,
                   "wall_time_s": 7.0, "tokens": 4096.0, "samples": 8.0,
                   "data_wait_s": 0.125, "forward_s": 0.25, "backward_s": 0.25,
                   "optimizer_s": 0.0625, "tool_s": 0.03125, "fetch_s": 0.5, "loss": 2.5,
                   "lr": 1e-3, "grad_norm": 0.75, "accuracy": 0.5, "synced": 0.0}


def test_record_step_follows_the_nan_and_unset_rules_of_the_step_path(tmp_path: Path) -> None:
    """The same inputs through step() and record_step() give the same records."""
    clk = FakeClock()
    a = Recorder(tmp_path / "a", clock=clk, wall_clock=lambda: 3.0, background=False,
                 no_usage=True)
    b = Recorder(tmp_path / "b", clock=clk, wall_clock=lambda: 3.0, background=False,
                 no_usage=True)
    values = {"loss": math.nan, "lr": math.nan, "grad_norm": math.inf, "bad": "x"}
    for rec in (a, b):
        clk.tick(1.0)
        rec.add_time("data_wait", 0.5)  # measured before the step: counts in it
    t0 = clk()
    with a.step(tokens=16):
        with a._handle.phase("forward"):
            clk.tick(0.25)
        a.log(**values)  # type: ignore[arg-type]
    b.record_step(t0, clk(), tokens=16, phases={"forward": 0.25},
                  values=values)  # type: ignore[arg-type]
    for rec in (a, b):
        rec.close()
    ta, _ = RunDir.open(tmp_path / "a").read_steps()
    tb, _ = RunDir.open(tmp_path / "b").read_steps()
    assert sorted(ta.columns) == sorted(tb.columns)
    for col in ta.columns:
        assert np.array_equal(ta[col], tb[col], equal_nan=True), col
    assert tb["step_time_s"].tolist() == [0.75] and tb["data_wait_s"].tolist() == [0.5]
    assert bool(tb["loss_nan"][0]) and "lr_nan" not in tb.columns  # lr NaN = not known
    assert "bad" not in tb.columns


def test_listeners_see_every_record_on_the_writer_thread(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "run", clock=FakeClock(), flush_interval_s=0.01)
    seen: list[tuple[str, list[int]]] = []
    done = threading.Event()

    def listener(records: list[dict[str, object]]) -> None:
        seen.append((threading.current_thread().name,
                     [int(r["step"]) for r in records if "step_time_s" in r]))  # type: ignore[call-overload]
        if sum(len(s) for _, s in seen) >= 3:
            done.set()

    def broken(records: list[dict[str, object]]) -> None:
        raise RuntimeError("a live rule with a bug")

    rec.add_listener(broken)
    rec.add_listener(listener)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for i in range(3):
            rec.record_step(float(i), float(i) + 0.5, values={"loss": 1.0})
        assert done.wait(10.0)
        rec.close()
    assert [s for _, steps in seen for s in steps] == [0, 1, 2]
    assert {name for name, _ in seen} == {"stepscope-writer-0"}
    assert len([w for w in caught if "no longer called" in str(w.message)]) == 1
