"""StepSession: the per-step core every adapter feeds; exact numbers from an injected clock."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from stepscope import Recorder, RunDir
from stepscope.record.crossrank import FileExchange
from stepscope.record.session import StepSession


class FakeClock:
    """A clock that advances only when told to: tests get exact durations."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t

    def tick(self, dt: float) -> None:
        self.t += dt


class TimedCapture:
    """A profiler capture that costs known time: 0.25 s to start, 1.0 s to stop.

    Stands in for a real profiler only in its cost (which a real one cannot give exactly);
    the real MindSpore capture is exercised in tests/integrations.
    """

    def __init__(self, clock: FakeClock, first: int, last: int) -> None:
        self.clock, self.first, self.last = clock, first, last
        self.calls: list[tuple[str, int]] = []

    def before_step(self, step: int) -> None:
        self.calls.append(("before", step))
        if step == self.first:
            self.clock.tick(0.25)

    def after_step(self, step: int) -> None:
        self.calls.append(("after", step))
        if step == self.last:
            self.clock.tick(1.0)

    def active(self, step: int) -> bool:
        return self.first <= step <= self.last

    def close(self) -> None:
        self.calls.append(("close", -1))


def _session(tmp_path: Path, clk: FakeClock, **kwargs: object) -> StepSession:
    rec = Recorder(tmp_path / "run", clock=clk, wall_clock=lambda: 9.0, background=False,
                   no_usage=True)
    return StepSession(rec, clock=clk, **kwargs)  # type: ignore[arg-type]


def _rows(tmp_path: Path, *cols: str) -> list[dict[str, float]]:
    table, _ = RunDir.open(tmp_path / "run").read_steps()
    return [{c: table[c].tolist()[i] for c in cols if c in table.columns}
            for i in range(len(table))]


def test_callback_events_become_one_exact_row_per_step(tmp_path: Path) -> None:
    clk = FakeClock()
    s = _session(tmp_path, clk, mem_probe=lambda: (2e9, 1e9))
    for _ in range(2):
        clk.tick(0.5)  # the trainer fetching the batch: data wait
        s.begin()
        s.count(1024, 4)
        s.count(1024, 4)  # a second micro-batch
        s.mark()
        clk.tick(0.25)
        s.lap("forward")
        clk.tick(0.5)
        s.lap("backward")
        with s.phase("optimizer"):
            clk.tick(0.125)
        s.log(lr=1e-3, grad_norm=None)  # None: not seen
        s.end(values={"accuracy": 0.5}, loss=2.5)
    s.close()
    cols = ("step", "step_time_s", "data_wait_s", "forward_s", "backward_s", "optimizer_s",
            "tokens", "samples", "lr", "loss", "accuracy", "mem_peak_bytes", "end_s")
    assert _rows(tmp_path, *cols) == [
        {"step": 0, "step_time_s": 1.375, "data_wait_s": 0.5, "forward_s": 0.25,
         "backward_s": 0.5, "optimizer_s": 0.125, "tokens": 2048.0, "samples": 8.0,
         "lr": 1e-3, "loss": 2.5, "accuracy": 0.5, "mem_peak_bytes": 2e9, "end_s": 1.375},
        {"step": 1, "step_time_s": 1.375, "data_wait_s": 0.5, "forward_s": 0.25,
         "backward_s": 0.5, "optimizer_s": 0.125, "tokens": 2048.0, "samples": 8.0,
         "lr": 1e-3, "loss": 2.5, "accuracy": 0.5, "mem_peak_bytes": 2e9, "end_s": 2.75},
    ]


def test_work_between_steps_is_its_column_not_data_wait(tmp_path: Path) -> None:
    clk = FakeClock()
    s = _session(tmp_path, clk)
    for k in range(3):
        clk.tick(0.5)  # the fetch
        if k == 1:
            clk.tick(2.0)  # an evaluation the framework timed itself
            s.between_steps("eval_s", 2.0)
        if k == 2:
            clk.tick(0.25)  # a save reported longer than the gap it took: scaled to fit
            s.between_steps("checkpoint_s", 1.0)
            s.between_steps("not_a_column", 9.0)  # ignored
        s.begin()
        clk.tick(0.25)
        s.end(loss=1.0)
    s.close()
    rows = _rows(tmp_path, "step_time_s", "data_wait_s", "eval_s", "checkpoint_s")
    assert [{k: v for k, v in r.items() if v == v} for r in rows] == [  # NaN: not booked
        {"step_time_s": 0.75, "data_wait_s": 0.5},
        {"step_time_s": 0.75, "data_wait_s": 0.5, "eval_s": 2.0},  # the 2 s left out
        {"step_time_s": 0.25, "data_wait_s": 0.0, "checkpoint_s": 0.75},
    ]


def test_measured_steps_are_recorded_as_given(tmp_path: Path) -> None:
    clk = FakeClock()
    s = _session(tmp_path, clk)
    s.record(200.0, 200.5, wall_end_s=3.0, tokens=512, phases={"forward": 0.125,
             "tool": 0.0625}, values={"lr": 0.5}, loss=1.5)
    s.record(200.5, 201.25, wall_end_s=4.0, samples=2, values={"comm_s": 0.25})
    s.close()
    rows = _rows(tmp_path, "step_time_s", "wall_time_s", "tokens", "samples", "tool_s",
                 "forward_s", "lr", "loss", "comm_s")
    assert rows[0]["step_time_s"] == 0.5 and rows[1]["step_time_s"] == 0.75
    assert [r["wall_time_s"] for r in rows] == [3.0, 4.0]
    assert (rows[0]["forward_s"], rows[0]["lr"], rows[0]["loss"]) == (0.125, 0.5, 1.5)
    assert math.isnan(rows[0]["comm_s"]) and rows[1]["comm_s"] == 0.25
    assert rows[0]["tokens"] == 512.0 and math.isnan(rows[1]["tokens"])
    assert math.isnan(rows[0]["samples"]) and rows[1]["samples"] == 2.0
    assert rows[0]["tool_s"] == 0.0625 and math.isnan(rows[1]["tool_s"])


def test_a_missing_loss_is_reported_once_as_a_finding(tmp_path: Path) -> None:
    clk = FakeClock()
    s = _session(tmp_path, clk, loss_source="the custom loop")
    for step in range(3):
        s.record(float(step), step + 1.0, loss=None if step else 2.0,
                 missing_loss="held no loss")
    s.close()
    events, _ = RunDir.open(tmp_path / "run").read_events(type="finding")
    assert [e["message"] for e in events] == [
        "no loss recorded: the custom loop at step 1 held no loss; "
        "the loss curve of this run would be empty"]
    assert s.summary() == {"steps_with_loss": 1, "steps_without_loss": 2}


def test_profiler_time_is_tool_time_and_stays_in_the_step_time(tmp_path: Path) -> None:
    """Starting the profiler (0.25 s) is inside step 1; stopping it (1.0 s) after step 1
    happens between steps and is billed to step 2, whose step time covers it."""
    clk = FakeClock()
    cap = TimedCapture(clk, first=1, last=1)
    s = _session(tmp_path, clk, capture=cap)
    for _ in range(3):
        clk.tick(0.5)
        s.begin()
        with s.phase("forward"):
            clk.tick(1.0)
        s.end()
    s.close()
    rows = _rows(tmp_path, "step_time_s", "data_wait_s", "forward_s", "tool_s", "end_s")
    assert [r["step_time_s"] for r in rows] == [1.5, 1.75, 2.5]
    assert [r["data_wait_s"] for r in rows] == [0.5, 0.5, 0.5]
    assert [r["forward_s"] for r in rows] == [1.0, 1.0, 1.0]
    assert math.isnan(rows[0]["tool_s"]) and rows[1]["tool_s"] == 0.25
    assert rows[2]["tool_s"] == 1.0
    assert [r["end_s"] for r in rows] == [1.5, 3.25, 5.75]  # no second is lost or doubled
    assert cap.calls[-1] == ("close", -1)


def test_cross_rank_exchange_every_n_steps_logs_the_views_score(tmp_path: Path) -> None:
    clk = FakeClock()
    s = _session(tmp_path, clk)
    published: list[tuple[int, list[float]]] = []

    def exchange(step: int, vector: Sequence[float]) -> dict[str, object]:
        published.append((step, list(vector)))
        clk.tick(0.125)  # the exchange's own time (one small file write)
        return {"straggler_scores": {"0": 2.0, "1": 2.0 / 3.0}}

    s.enable_cross_rank(world=2, every=2, exchange=exchange)
    for step in range(4):
        s.record(10.0 * step, 10.0 * step + 1.0 + step, phases={"data_wait": 0.5})
    s.close()
    # medians of the window after steps 2 and 4: step time, data wait, compute
    assert published == [(1, [1.5, 0.5, 1.0]), (3, [2.5, 0.5, 2.0])]
    rows = _rows(tmp_path, "straggler_score", "tool_s")
    assert rows[1]["straggler_score"] == 2.0 and rows[3]["straggler_score"] == 2.0
    assert math.isnan(rows[0]["straggler_score"])
    assert rows[2]["tool_s"] == 0.125  # the exchange after step 1, billed to step 2


def test_cross_rank_through_the_run_directory_scores_a_slow_peer(tmp_path: Path) -> None:
    clk = FakeClock()
    s = _session(tmp_path, clk)
    s.enable_cross_rank(world=2, every=2)
    assert s.cross is not None
    # rank 1, as its own process would publish (it reaches each step first): 3x the compute
    peer = FileExchange(RunDir(tmp_path / "run"), 1, 2, lambda st, rows: {}, max_lag_steps=6)
    for step in range(4):
        if step % 2 == 1:
            peer(step, [1.5 + step - 1, 0.5, 3.0 * step])
        s.record(10.0 * step, 10.0 * step + 1.0 + step, phases={"data_wait": 0.5})
        s.cross.exchange.join()  # rank 0's merge thread, for a fixed order
    s.close()
    events, _ = RunDir.open(tmp_path / "run").read_events(type="cross_rank")
    assert [e["step"] for e in events] == [1, 3] and all(e["aligned"] for e in events)
    assert events[0]["stragglers"] == [1]
    # reference = the fastest rank's compute median (1.0): HealthConfig's one definition
    assert events[0]["straggler_scores"] == {"0": 1.0, "1": 1.0 / 3.0}


def test_single_rank_never_gathers(tmp_path: Path) -> None:
    s = _session(tmp_path, FakeClock())
    s.enable_cross_rank(world=1, every=1)
    assert s.cross is None
    s.close()


def test_live_rules_subscribe_to_completed_rows(tmp_path: Path) -> None:
    clk = FakeClock()
    s = _session(tmp_path, clk)
    seen: list[tuple[int, float]] = []
    s.subscribe(lambda records: seen.extend(
        (int(r["step"]), float(r["step_time_s"])) for r in records if "step_time_s" in r))
    s.record(0.0, 0.5)
    s.record(0.5, 1.75)
    s.rec.flush()  # what the writer thread does every flush interval
    assert seen == [(0, 0.5), (1, 1.25)]
    s.close()


def test_timed_communication_is_not_compute_for_the_straggler_score(tmp_path: Path) -> None:
    """A fast rank waits for a slow one in its all-reduce: that wait is comm, not compute."""
    s = _session(tmp_path, FakeClock())
    gathered: list[list[float]] = []
    s.enable_cross_rank(world=2, every=1,
                        exchange=lambda step, m: gathered.append(list(m)) or None)
    s.record(0.0, 1.5, phases={"data_wait": 0.25, "comm": 0.75})
    s.close()
    assert gathered == [[1.5, 0.25, 0.5]]


def test_loss_memory_and_cross_rank_together_with_exact_numbers(tmp_path: Path) -> None:
    """(Moved from tests/traces when the session became the core's.)"""
    clk = FakeClock()
    gathered: list[list[float]] = []

    def exchange(step: int, values: Sequence[float]) -> None:
        gathered.append(list(values))

    s = _session(tmp_path, clk, loss_source="the loop", mem_probe=lambda: (100.0, 50.0))
    s.enable_cross_rank(world=2, every=2, exchange=exchange)
    for loss in [2.0, None, 1.5, 1.4]:
        s.begin(wait_s=0.25)  # e.g. measured by wrap_loader
        s.count(64, 4)
        clk.tick(1.0)
        s.add_time("comm", 0.5)
        s.end(values={"lr": 0.1}, loss=loss, missing_loss="held no loss")
    s.close()
    table, _ = RunDir(tmp_path / "run").read_steps()
    assert table["step_time_s"].tolist() == [1.25] * 4
    assert math.isnan(table["loss"][1]) and table["loss"][[0, 2, 3]].tolist() == [2.0, 1.5, 1.4]
    assert table["mem_peak_bytes"].tolist() == [100.0] * 4
    assert table["tokens"].tolist() == [64.0] * 4
    # compute = 1.25 step - 0.25 wait - 0.5 comm
    assert gathered == [[1.25, 0.25, 0.5], [1.25, 0.25, 0.5]]
    events, _ = RunDir(tmp_path / "run").read_events()
    events = [e for e in events if e["type"] != "process"]  # the recorder's start record
    assert [e["type"] for e in events] == ["finding"]  # the exchange's events: its own tests
    assert events[0]["message"].startswith("no loss recorded: the loop at step 1 held no loss")


class Queue:
    """An asynchronous device in its cost only: work is queued and the host pays for it
    when it synchronises (the real MindSpore sync runs in tests/integrations)."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock, self.pending, self.syncs = clock, 0.0, 0

    def launch(self, seconds: float) -> None:
        self.pending += seconds

    def sync(self) -> None:
        self.syncs += 1
        self.clock.tick(self.pending)
        self.pending = 0.0


def test_every_nth_step_is_synced_at_its_phase_boundaries(tmp_path: Path) -> None:
    clk = FakeClock()
    clk.t = 0.0  # sums of binary fractions stay exact from 0
    q = Queue(clk)
    s = _session(tmp_path, clk, sync=q.sync, sync_every=2)
    for _ in range(3):
        s.begin(wait_s=0.0)
        with s.phase("forward_backward"):
            q.launch(0.25)  # dispatched: returns at once
        with s.phase("comm"):
            clk.tick(0.5)  # a collective that waits for the queued compute
            q.pending = 0.0
        s.end()
    s.close()
    table, _ = RunDir.open(tmp_path / "run").read_steps()
    assert table["synced"].tolist() == [1.0, 0.0, 1.0]
    # synced steps: the compute is in its own phase; unsynced: the collective absorbs it
    assert table["forward_backward_s"].tolist() == [0.25, 0.0, 0.25]
    assert table["comm_s"].tolist() == [0.5, 0.5, 0.5]


def test_no_sync_function_means_no_synced_rows(tmp_path: Path) -> None:
    clk = FakeClock()
    s = _session(tmp_path, clk, sync=None, sync_every=2)
    s.begin(wait_s=0.0)
    with s.phase("optimizer"):
        clk.tick(0.1)
    s.end()
    s.close()
    table, _ = RunDir.open(tmp_path / "run").read_steps()
    assert table["synced"].tolist() == [0.0]
