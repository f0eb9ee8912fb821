"""Run store: torn/corrupt records are skipped and counted; ranks write their own files."""

from __future__ import annotations

import math
import multiprocessing as mp
from pathlib import Path

import numpy as np
import pytest

from stepscope import Recorder, RunDir, RunMeta
from stepscope.errors import RunDirError


def _make(tmp_path: Path) -> RunDir:
    return RunDir.create(tmp_path / "run", RunMeta(run_id="r1", baseline={"seq_len": 8}))


def test_roundtrip_meta(tmp_path: Path) -> None:
    run = _make(tmp_path)
    meta = RunDir.open(run.path).read_meta()
    assert meta.run_id == "r1" and meta.baseline == {"seq_len": 8} and meta.status == "running"
    run.update_meta(status="finished", baseline={"lr": 0.1})
    meta = run.read_meta()
    assert meta.status == "finished" and meta.baseline == {"seq_len": 8, "lr": 0.1}


def test_torn_last_line_and_corrupt_records_are_skipped_and_counted(tmp_path: Path) -> None:
    run = _make(tmp_path)
    run.steps_path(0).write_bytes(
        b'{"rank":0,"step":0,"step_time_s":1.0,"loss":2.0}\n'
        b"not json at all\n"
        b"[1,2,3]\n"
        b'{"rank":0,"step":"x"}\n'
        b'{"rank":0,"step":1,"step_time_s":0.5,"custom_metric":7}\n'
        b'{"rank":0,"step":2,"step_ti'
    )
    table, stats = run.read_steps()
    assert table["step"].tolist() == [0, 1]
    assert table["step_time_s"].tolist() == [1.0, 0.5]
    assert table["loss"][0] == 2.0 and math.isnan(table["loss"][1])
    assert table["custom_metric"][1] == 7.0
    assert stats.records == 2 and stats.skipped == 4 and stats.torn_tail == 1
    assert any("torn last line" in p for p in stats.problems)


def test_late_records_merge_into_their_step(tmp_path: Path) -> None:
    run = _make(tmp_path)
    run.steps_path(0).write_bytes(
        b'{"rank":0,"step":0,"step_time_s":1.0}\n{"rank":0,"step":0,"loss":3.5}\n')
    table, _ = run.read_steps()
    assert len(table) == 1 and table["loss"][0] == 3.5 and table["step_time_s"][0] == 1.0


def _rank_worker(path: str, rank: int) -> None:
    rec = Recorder(path, rank=rank, flush_interval_s=0.01)
    for i in range(200):
        with rec.step(tokens=10 * (rank + 1), samples=1) as s:
            s.log(loss=float(i))
    rec.close()


def test_concurrent_ranks_write_their_own_files(tmp_path: Path) -> None:
    path = tmp_path / "run"
    RunDir.create(path, RunMeta(run_id="ddp"))
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_rank_worker, args=(str(path), r)) for r in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    table, stats = RunDir.open(path).read_steps()
    assert stats.skipped == 0 and stats.files == 3
    assert table.ranks() == [0, 1, 2]
    for r in range(3):
        part = table.rank(r)
        assert part["step"].tolist() == list(range(200))
        assert np.all(part["tokens"] == 10 * (r + 1))


def test_open_rejects_missing_non_run_and_corrupt(tmp_path: Path) -> None:
    with pytest.raises(RunDirError, match="does not exist"):
        RunDir.open(tmp_path / "nope")
    (tmp_path / "plain").mkdir()
    with pytest.raises(RunDirError, match="not a run directory"):
        RunDir.open(tmp_path / "plain")
    run = _make(tmp_path)
    run.meta_path.write_text("{ broken")
    with pytest.raises(RunDirError, match="corrupt"):
        RunDir.open(run.path)


def test_events_append_and_read(tmp_path: Path) -> None:
    run = _make(tmp_path)
    run.append_event({"type": "alert", "message": "x"})
    run.append_event({"type": "eval", "step": 3, "val_loss": 1.5})
    with open(run.events_path, "ab") as f:
        f.write(b'{"type": "ev')  # torn
    events, stats = run.read_events()
    assert [e["type"] for e in events] == ["alert", "eval"] and stats.torn_tail == 1
    assert run.read_events(type="eval")[0][0]["val_loss"] == 1.5


def test_explicit_nan_is_kept_apart_from_not_recorded(tmp_path: Path) -> None:
    rec = Recorder(tmp_path / "run", background=False)
    for loss in (1.0, float("nan"), float("inf")):
        with rec.step(tokens=4) as s:
            s.log(loss=loss)
    with rec.step(tokens=4):  # loss not logged at all
        pass
    rec.log(grad_norm=float("nan"))  # late record, after the step closed
    rec.close()
    raw = (tmp_path / "run" / "steps" / "rank-00000.jsonl").read_text()
    assert '"loss":"NaN"' in raw and '"loss":"Infinity"' in raw
    table, stats = RunDir.open(tmp_path / "run").read_steps()
    assert stats.skipped == 0
    loss = table["loss"]
    assert loss[0] == 1.0 and math.isnan(loss[1]) and loss[2] == math.inf
    assert math.isnan(loss[3])
    assert table["loss_nan"].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert table["grad_norm_nan"].tolist() == [0.0, 0.0, 0.0, 1.0]
    assert "tokens_nan" not in table


def test_wrong_typed_values_do_not_break_the_reader(tmp_path: Path) -> None:
    run = _make(tmp_path)
    run.steps_path(0).write_bytes(
        b'{"rank":0,"step":0,"loss":"abc","lr":true,"note":[1],"step_time_s":1}\n')
    table, stats = run.read_steps()
    assert len(table) == 1 and math.isnan(table["loss"][0]) and math.isnan(table["lr"][0])
    assert table["step_time_s"][0] == 1.0
