"""Live export while training (`stepscope run --tensorboard DIR --mlflow URI`): the records
reach TensorBoard and MLflow from the recorder's writer thread as they are written, and
read back with the tools' own readers (TensorBoard's EventAccumulator, MlflowClient on a
SQLite URI) they equal the recorded values."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from stepscope import RunDir
from stepscope.analysis.series import step_series
from stepscope.record.recorder import Recorder
from stepscope.report.live_export import attach
from support.torch_run import SCRIPTS, python_script, stepscope_run

ea_mod = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
pytest.importorskip("tensorboardX")
mlflow = pytest.importorskip("mlflow")


def _tensorboard(logdir: Path) -> dict[str, dict[int, float]]:
    ea = ea_mod.EventAccumulator(str(logdir))
    ea.Reload()
    return {tag: {e.step: e.value for e in ea.Scalars(tag)} for tag in ea.Tags()["scalars"]}


def _mlflow(uri: str) -> tuple[Any, dict[str, dict[int, float]]]:
    client = mlflow.MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("stepscope").experiment_id])
    got = {key: {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
           for key in run.data.metrics}
    return run, got


def _recorded(run_dir: Path) -> dict[str, dict[int, float]]:
    table, _ = RunDir.open(run_dir).read_steps()
    return {tag: dict(zip(s.tolist(), v.tolist(), strict=True))
            for tag, (s, v) in step_series(table).items()}


def _same(got: dict[int, float], want: dict[int, float], rel: float) -> bool:
    return got.keys() == want.keys() and all(
        math.isclose(got[s], want[s], rel_tol=rel) for s in want)


def test_points_arrive_at_each_flush_while_the_run_is_still_open(tmp_path: Path) -> None:
    t = [100.0]
    rec = Recorder(tmp_path / "run", clock=lambda: t[0], background=False)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    live = attach(rec, tensorboard=tmp_path / "tb", mlflow=uri)
    for i in range(10):
        with rec.step(tokens=1000, samples=4) as s:
            t[0] += 0.25 + 0.01 * i
            s.log(loss=3.0 - 0.1 * i, lr=1e-3)
        if i == 4:
            rec.flush()  # what the writer thread does every 0.5 s
            # Five steps in, the run still open: both trackers already hold them.
            assert sorted(_tensorboard(tmp_path / "tb")["result/loss"]) == [0, 1, 2, 3, 4]
            run, got = _mlflow(uri)
            assert run.info.status == "RUNNING" and sorted(got["result/loss"]) == [0, 1, 2, 3, 4]
    rec.close()
    live.close("finished")
    want = _recorded(tmp_path / "run")
    board = _tensorboard(tmp_path / "tb")
    run, tracked = _mlflow(uri)
    assert run.info.status == "FINISHED"
    assert {"result/loss", "train/lr", "efficiency/step_time_s",
            "efficiency/tokens_per_s"} <= set(want)
    for tag, values in want.items():
        assert _same(board[tag], values, 1e-6), tag  # event files keep float32
        assert _same(tracked[tag], values, 1e-12), tag


def test_stepscope_run_exports_live_to_tensorboard_and_mlflow(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    proc = stepscope_run(tmp_path / "run", *python_script("torch_plain.py", "--steps", "12"),
                         args=("--tensorboard", str(tmp_path / "tb"), "--mlflow", uri),
                         timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "live export" not in proc.stderr  # no warning from the listener
    want = _recorded(tmp_path / "run")
    board = _tensorboard(tmp_path / "tb")
    run, tracked = _mlflow(uri)
    assert run.info.status == "FINISHED"
    assert run.data.tags["stepscope.run_dir"] == str((tmp_path / "run").resolve())
    params = run.data.params  # the baseline (and config) as params
    assert params and all(k.startswith(("baseline.", "config.")) for k in params), params
    assert len(want["result/loss"]) == 12
    for tag, values in want.items():
        assert _same(board[tag], values, 1e-6), tag
        assert _same(tracked[tag], values, 1e-12), tag
    assert list((tmp_path / "tb").glob("events.out.tfevents.*.rank00000"))


def test_a_missing_tracker_library_stops_the_launch_with_one_line(tmp_path: Path) -> None:
    """No tensorboardX on the path: exit 2 before the command starts, nothing recorded."""
    blocker = tmp_path / "block"
    blocker.mkdir()
    # A module that fails to import, found before the real one (what an absent package does).
    (blocker / "tensorboardX.py").write_text("raise ImportError('not installed')\n")
    env = {"PYTHONPATH": os.pathsep.join([str(blocker), os.environ.get("PYTHONPATH", "")])}
    proc = stepscope_run(tmp_path / "run", *python_script("torch_plain.py", "--steps", "3"),
                         args=("--tensorboard", str(tmp_path / "tb")), env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "needs the tensorboardX package" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "steps").exists()


@pytest.mark.slow
@pytest.mark.xdist_group("torchrun")
def test_each_rank_of_a_torchrun_job_writes_its_own_step_times(tmp_path: Path) -> None:
    """Two ranks (DDP, gloo): each writes ranks/NNNNN/step_time_s into its own event file,
    rank 0 the lowest rank's series; the job-level maximum is left to `stepscope export`."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    torchrun = str(Path(sys.executable).parent / "torchrun")
    proc = stepscope_run(tmp_path / "ddp", torchrun, "--standalone", "--nproc_per_node", "2",
                         str(SCRIPTS / "torch_ddp.py"), "--steps", "8",
                         args=("--tensorboard", str(tmp_path / "tb"), "--mlflow", uri),
                         timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = _recorded(tmp_path / "ddp")
    board = _tensorboard(tmp_path / "tb")
    assert len(list((tmp_path / "tb").glob("events.out.tfevents.*.rank0000[01]"))) == 2
    for tag in ("ranks/00000/step_time_s", "ranks/00001/step_time_s", "result/loss"):
        assert _same(board[tag], want[tag], 1e-6), tag
    assert "efficiency/step_time_s" not in board  # a max over ranks no process sees live
    run, tracked = _mlflow(uri)  # one MLflow run for the job, from rank 0
    assert run.info.status == "FINISHED"
    assert _same(tracked["result/loss"], want["result/loss"], 1e-12)
    assert _same(tracked["ranks/00000/step_time_s"], want["ranks/00000/step_time_s"], 1e-12)
