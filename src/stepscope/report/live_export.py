"""Live export while training: each batch of step records to TensorBoard and MLflow.

``stepscope run --tensorboard DIR --mlflow URI`` sets ``STEPSCOPE_TENSORBOARD`` and
``STEPSCOPE_MLFLOW`` for the training command; in every Recorder of it the plug board
(``stepscope.plugs``) then starts a :class:`LiveExport` (:func:`plug`) on its writer
thread's listener list, so the training thread never waits on either library. The series
are those of ``analysis.series.step_series`` (what ``stepscope export`` writes after the
run), computed on each batch:

- one process (one rank): every series, exactly as the after-the-run export;
- several ranks: each rank writes its own step time (``ranks/NNNNN/step_time_s``, up to
  ``MAX_RANK_SERIES`` ranks) into its own event file, and rank 0 the series defined by the
  lowest rank (``result/*``, ``train/*``). The job-level efficiency and system series are
  a maximum or sum over ranks that no single process sees: ``stepscope export`` writes them
  after the run.

MLflow gets one run per job, written by rank 0, marked RUNNING until the recorder closes.
The libraries are imported and the MLflow run created on the writer thread, at the first
batch: a slow tracking store never delays the training loop, and a failure is one warning
(the listener is then dropped by the writer), never an exception in training.

Example::

    rec = Recorder("runs/exp1")
    live = attach(rec, tensorboard="tb/exp1", mlflow="sqlite:///mlflow.db")
    ...                                   # training; points appear at each flush
    rec.close(); live.close("finished")
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..analysis.series import MAX_RANK_SERIES, step_series
from ..plugs import MLFLOW_ENV, MLFLOW_EXPERIMENT_ENV, TENSORBOARD_ENV, PlugContext
from ..schema import AnyArray, StepTable
from .export import baseline_params, mlflow_status, require_library

__all__ = ["LiveExport", "attach", "plug", "DEFAULT_EXPERIMENT"]

DEFAULT_EXPERIMENT = "stepscope"
# The lowest rank's series (analysis.series.SERIES, "first" over ranks): the same whichever
# process computes them, so rank 0 writes them live even in a multi-rank job.
_LOWEST_RANK = ("result/", "train/")
_MLFLOW_BATCH = 1000  # MLflow's documented limit of metrics per log_batch


def _world_size() -> int:
    for var in ("WORLD_SIZE", "RANK_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"):
        value = os.environ.get(var, "").strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def _table(records: Sequence[dict[str, Any]]) -> StepTable:
    """One row per (rank, step): a value logged after its step closed (a partial record)
    fills its step's row."""
    rows: dict[tuple[int, int], dict[str, float]] = {}
    for rec in records:
        try:
            key = (int(rec.get("rank", 0)), int(rec["step"]))
        except (KeyError, TypeError, ValueError):
            continue
        row = rows.setdefault(key, {})
        for k, v in rec.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                row[k] = float(v)
    names = sorted({k for r in rows.values() for k in r} - {"rank", "step"})
    keys = sorted(rows)
    cols: dict[str, Any] = {"rank": np.array([k[0] for k in keys], dtype=np.int64),
                            "step": np.array([k[1] for k in keys], dtype=np.int64)}
    for name in names:
        cols[name] = np.array([rows[k].get(name, np.nan) for k in keys], dtype=np.float64)
    return StepTable.from_columns(cols)


class LiveExport:
    """A writer-thread listener that sends each batch to TensorBoard and/or MLflow."""

    def __init__(self, run: Any, rank: int, tensorboard: str | os.PathLike[str] | None = None,
                 mlflow: str | None = None, experiment: str = DEFAULT_EXPERIMENT,
                 world_size: int | None = None) -> None:
        self.run, self.rank = run, int(rank)
        self.world = int(world_size) if world_size is not None else _world_size()
        self.tensorboard = Path(tensorboard) if tensorboard else None
        self.mlflow = mlflow if mlflow and self.rank == 0 else None
        self.experiment = experiment
        self.points = 0
        self._tb: Any = None
        self._client: Any = None
        self._run_id: str | None = None
        self._lock = threading.Lock()  # on_records (writer thread) against close()

    # -- which series this process writes ---------------------------------------------
    def _series(self, records: Sequence[dict[str, Any]]
                ) -> dict[str, tuple[AnyArray, AnyArray]]:
        table = _table(records)
        if not len(table):
            return {}
        series = step_series(table)
        if self.world <= 1:
            return series
        out = {k: v for k, v in series.items()
               if self.rank == 0 and k.startswith(_LOWEST_RANK)}
        if self.world <= MAX_RANK_SERIES and table.has_data("step_time_s"):
            ok = np.isfinite(table["step_time_s"])
            out[f"ranks/{self.rank:05d}/step_time_s"] = (table["step"][ok],
                                                         table["step_time_s"][ok])
        return out

    @staticmethod
    def _walls(records: Sequence[dict[str, Any]]) -> dict[int, float]:
        return {int(r["step"]): float(r["wall_time_s"]) for r in records
                if isinstance(r.get("wall_time_s"), (int, float)) and "step" in r}

    # -- the listener --------------------------------------------------------------------
    def on_records(self, records: list[dict[str, Any]]) -> None:
        """Called by the recorder's writer thread after each batch is written."""
        series = self._series(records)
        if not series:
            return
        walls = self._walls(records)
        with self._lock:
            if self.tensorboard is not None:
                self._to_tensorboard(series, walls)
            if self.mlflow is not None:
                self._to_mlflow(series, walls)

    def _to_tensorboard(self, series: dict[str, tuple[AnyArray, AnyArray]],
                        walls: dict[int, float]) -> None:
        require_library("tensorboard")
        # tensorboardX's synchronous EventsWriter, not its SummaryWriter: the latter hands
        # events to a thread through a multiprocessing queue, whose feeder the interpreter's
        # exit stops before the recorder's last flush (the last batches were lost). This
        # runs on the recorder's writer thread already, so writing in place costs training
        # nothing.
        from tensorboardX.event_file_writer import EventsWriter
        from tensorboardX.proto.event_pb2 import Event
        from tensorboardX.summary import scalar

        if self._tb is None:
            assert self.tensorboard is not None
            self.tensorboard.mkdir(parents=True, exist_ok=True)
            # One event file per rank in one directory: TensorBoard merges them.
            self._tb = EventsWriter(str(self.tensorboard / "events"),
                                    filename_suffix=f".rank{self.rank:05d}")
        now = time.time()
        # Step-major order: TensorBoard's loader drops a tag's points when its steps go back.
        points = sorted((int(s), tag, float(v)) for tag, (steps, vals) in series.items()
                        for s, v in zip(steps.tolist(), vals.tolist(), strict=True))
        for step, tag, value in points:
            self._tb.write_event(Event(wall_time=walls.get(step, now), step=step,
                                       summary=scalar(tag, value)))
        self.points += len(points)
        self._tb.flush()  # visible to a reader now

    def _to_mlflow(self, series: dict[str, tuple[AnyArray, AnyArray]],
                   walls: dict[int, float]) -> None:
        if self._client is None:
            mlflow = require_library("mlflow")
            client = mlflow.MlflowClient(tracking_uri=self.mlflow)
            exp = client.get_experiment_by_name(self.experiment)
            exp_id = exp.experiment_id if exp else client.create_experiment(self.experiment)
            meta = self.run.read_meta()
            run = client.create_run(exp_id, run_name=meta.name or meta.run_id or "stepscope",
                                    tags={"stepscope.run_id": meta.run_id or "",
                                          "stepscope.run_dir": str(self.run.path),
                                          "stepscope.live": "1"})
            self._client, self._run_id = client, run.info.run_id
        from mlflow.entities import Metric  # the mlflow package, imported above

        now_ms = int(1000 * max(walls.values())) if walls else 0
        metrics = [Metric(tag, float(v), int(1000 * walls[s]) if s in walls else now_ms, int(s))
                   for tag, (steps, vals) in series.items()
                   for s, v in zip(steps.tolist(), vals.tolist(), strict=True)]
        for i in range(0, len(metrics), _MLFLOW_BATCH):
            self._client.log_batch(self._run_id, metrics=metrics[i:i + _MLFLOW_BATCH])
        self.points += len(metrics)

    def close(self, status: str = "finished") -> None:
        """Flush and close the event file; log the baseline as params and end the MLflow
        run with ``status``. Errors are warnings: the run's own files are already safe."""
        import warnings

        with self._lock:
            try:
                if self._tb is not None:
                    self._tb.close()
                if self._client is not None and self._run_id is not None:
                    from mlflow.entities import Param

                    params = [Param(k, v) for k, v in baseline_params(self.run.read_meta()).items()]
                    for i in range(0, len(params), 100):  # MLflow: 100 params per batch
                        self._client.log_batch(self._run_id, params=params[i:i + 100])
                    self._client.set_terminated(self._run_id, status=mlflow_status(status))
            except Exception as exc:
                warnings.warn(f"stepscope: live export did not close cleanly: {exc}",
                              RuntimeWarning, stacklevel=2)
            self._tb = self._client = None


def attach(rec: Any, tensorboard: str | os.PathLike[str] | None = None,
           mlflow: str | None = None, experiment: str = DEFAULT_EXPERIMENT) -> LiveExport:
    """Export ``rec``'s records live (see the module docstring); close the result after
    the recorder."""
    live = LiveExport(rec.run, rec.rank, tensorboard, mlflow, experiment)
    rec.add_listener(live.on_records)
    return live


def plug(ctx: PlugContext) -> LiveExport | None:
    """The plug board's ``live_export``: export as ``stepscope run --tensorboard/--mlflow``
    asked through the environment (None if it asked for neither)."""
    tb = os.environ.get(TENSORBOARD_ENV, "").strip()
    uri = os.environ.get(MLFLOW_ENV, "").strip()
    if not tb and not uri:
        return None
    experiment = os.environ.get(MLFLOW_EXPERIMENT_ENV, "").strip() or DEFAULT_EXPERIMENT
    return LiveExport(ctx.run, ctx.rank, tb or None, uri or None, experiment)
