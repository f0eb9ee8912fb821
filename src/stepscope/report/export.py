"""A run's records in other tools: TensorBoard event files, an MLflow run, CSV, Parquet.

TensorBoard and MLflow get the per-step series of :func:`stepscope.analysis.series.step_series`
(the dashboard draws the same ones). CSV and Parquet carry the whole step table, one row per
(rank, step).

Example::

    import stepscope
    from stepscope.report.export import export_run
    run = stepscope.open_run("runs/exp1")
    export_run(run.table, run.meta, run.sheet(), "tensorboard", "tb/exp1",
               findings=run.findings())
    export_run(run.table, run.meta, None, "mlflow", "sqlite:///mlflow.db")

Each target's library is an install extra (``pip install 'stepscope[export]'``); a missing one
is a ConfigError naming the package, before anything is written.
"""

from __future__ import annotations

import csv
import importlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import orjson

from ..analysis.series import MAX_RANK_SERIES, by_step, step_series
from ..analysis.summary import Sheet
from ..errors import ConfigError
from ..findings import Finding
from ..schema import AnyArray, RunMeta, StepTable

__all__ = ["TARGETS", "Exported", "step_series", "export_run", "export_table", "require_library",
           "baseline_params", "mlflow_status"]

TARGETS: tuple[str, ...] = ("tensorboard", "mlflow", "csv", "parquet")
_PACKAGES = {"tensorboard": "tensorboardX", "mlflow": "mlflow", "parquet": "pyarrow"}
# MLflow's log_batch accepts at most 1,000 metrics per call (its documented REST limit).
_MLFLOW_BATCH = 1000
# MLflow params: values longer than this are cut (500 chars in MLflow < 2.x servers).
_PARAM_CHARS = 500
_TAG_CHARS = 5000  # MLflow's limit on a tag value (5,000 characters since MLflow 1.x)


@dataclass
class Exported:
    """What an export wrote: where, how many points, and what it had to leave out."""

    target: str
    destination: str
    series: int = 0
    points: int = 0
    rows: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "destination": self.destination, "series": self.series,
                "points": self.points, "rows": self.rows, "notes": list(self.notes)}


def require_library(target: str) -> ModuleType:
    name = _PACKAGES[target]
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ConfigError(f"export to {target} needs the {name} package: "
                          "pip install 'stepscope[export]'") from None


def _wall_times(table: StepTable) -> dict[int, float]:
    if not table.has_data("wall_time_s"):
        return {}
    steps, wall = by_step(table, "wall_time_s", "max")
    return {int(s): float(w) for s, w in zip(steps, wall, strict=True)}


def baseline_params(meta: RunMeta) -> dict[str, str]:
    flat: dict[str, str] = {}
    for section in ("baseline", "config"):
        for key, value in sorted((getattr(meta, section) or {}).items()):
            if value is None:
                continue
            text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
            flat[f"{section}.{key}"] = text[:_PARAM_CHARS]
    return flat


def _summary_metrics(sheet: Sheet | None) -> dict[str, float]:
    if sheet is None:
        return {}
    fields = ("tokens_per_s", "samples_per_s", "step_time_s", "step_time_p90_s", "mfu", "hfu",
              "loss_last", "perplexity", "mem_peak_bytes", "data_wait_frac", "comm_frac",
              "comm_exposed_frac")
    return {f"summary/{k}": float(v) for k in fields
            if isinstance(v := getattr(sheet, k), (int, float)) and math.isfinite(v)}


def _findings_md(findings: Sequence[Finding]) -> str:
    if not findings:
        return "No findings."
    return "\n".join(f"- **{f.severity}** {f.category}"
                     + (f" (rank {f.rank})" if f.rank is not None else "")
                     + (f", steps {f.steps[0]}-{f.steps[1]}" if f.steps else "")
                     + f": {f.message}" + (f" Next: {f.recommendation}" if f.recommendation
                                           else "") for f in findings)


def _points(series: dict[str, tuple[AnyArray, AnyArray]]
            ) -> Iterator[tuple[str, int, float]]:
    for tag, (steps, vals) in series.items():
        for s, v in zip(steps.tolist(), vals.tolist(), strict=True):
            yield tag, int(s), float(v)


def _to_tensorboard(table: StepTable, meta: RunMeta, sheet: Sheet | None,
                    findings: Sequence[Finding], dest: Path, result: Exported) -> None:
    tbx = require_library("tensorboard")
    series = step_series(table)
    wall = _wall_times(table)
    writer = tbx.SummaryWriter(logdir=str(dest))
    try:
        for tag, step, value in _points(series):
            writer.add_scalar(tag, value, global_step=step, walltime=wall.get(step))
            result.points += 1
        last = int(table["step"].max())
        for tag, value in _summary_metrics(sheet).items():
            writer.add_scalar(tag, value, global_step=last)
            result.points += 1
        lines = [f"| {k} | {v} |" for k, v in baseline_params(meta).items()]
        writer.add_text("run", "\n".join(
            [f"stepscope run `{meta.name or meta.run_id}` ({meta.status})", "",
             "| variable | value |", "|---|---|", *lines]), global_step=0)
        writer.add_text("findings", _findings_md(findings), global_step=last)
    finally:
        writer.close()
    result.series = len(series)


def mlflow_status(status: str) -> str:
    return {"finished": "FINISHED", "failed": "FAILED", "running": "RUNNING"}.get(status,
                                                                                 "KILLED")


def _to_mlflow(table: StepTable, meta: RunMeta, sheet: Sheet | None,
               findings: Sequence[Finding], uri: str, experiment: str, result: Exported) -> None:
    mlflow = require_library("mlflow")
    from mlflow.entities import Metric, Param, RunTag  # the mlflow package, checked above

    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp else client.create_experiment(experiment)
    run = client.create_run(exp_id, run_name=meta.name or meta.run_id or "stepscope",
                            tags={"stepscope.run_id": meta.run_id or "",
                                  "stepscope.status": meta.status or ""})
    rid = run.info.run_id
    series = step_series(table)
    wall = _wall_times(table)
    fallback_ms = int(1000 * (max(wall.values()) if wall else 0))
    metrics = [Metric(tag, value, int(1000 * wall[step]) if step in wall else fallback_ms,
                      step) for tag, step, value in _points(series)]
    last = int(table["step"].max())
    metrics += [Metric(k, v, fallback_ms, last) for k, v in _summary_metrics(sheet).items()]
    params = [Param(k, v) for k, v in baseline_params(meta).items()]
    # A tag, not an artifact: artifacts of a SQLite-backed store land in the current
    # directory (./mlruns), which is not the user's to write into.
    tags = [RunTag("stepscope.command", " ".join(meta.command or [])[:_PARAM_CHARS]),
            RunTag("stepscope.findings", _findings_md(findings)[:_TAG_CHARS])]
    client.log_batch(rid, params=params, tags=tags)
    for i in range(0, len(metrics), _MLFLOW_BATCH):
        client.log_batch(rid, metrics=metrics[i:i + _MLFLOW_BATCH])
    client.set_terminated(rid, status=mlflow_status(meta.status or ""))
    result.series, result.points = len(series), len(metrics)
    result.destination = f"{uri} (experiment {experiment!r}, run {rid})"


def _cell(v: Any) -> Any:
    return "" if isinstance(v, float) and math.isnan(v) else v


def export_table(table: StepTable, meta: RunMeta, target: str, dest: Path) -> int:
    """The whole step table as CSV or Parquet (run.json in the Parquet schema metadata)."""
    cols = [c for c in table.columns if table.has_data(c) or c in ("rank", "step")]
    if target == "csv":
        with open(dest, "w", newline="", encoding="utf-8") as fh:
            w = csv.writer(fh)
            w.writerow(cols)
            for row in zip(*(table[c].tolist() for c in cols), strict=True):
                w.writerow([_cell(v) for v in row])
        return len(table)
    pa = require_library("parquet")
    import pyarrow.parquet as pq  # the pyarrow package, checked above

    arrow = pa.table({c: table[c] for c in cols})
    arrow = arrow.replace_schema_metadata({"stepscope.run": orjson.dumps(meta.to_dict(),
                                                                         default=str)})
    pq.write_table(arrow, dest)
    return len(table)


def export_run(table: StepTable, meta: RunMeta, sheet: Sheet | None, target: str,
               destination: str, experiment: str = "stepscope",
               findings: Sequence[Finding] = ()) -> Exported:
    """Write the run to ``target`` (one of TARGETS) at ``destination``; ``findings`` (from
    ``diagnose``) go in as text."""
    if target not in TARGETS:
        raise ConfigError(f"unknown export target {target!r}; expected one of "
                          f"{', '.join(TARGETS)}")
    result = Exported(target, destination)
    if target == "mlflow":
        _to_mlflow(table, meta, sheet, findings, destination, experiment, result)
        return result
    dest = Path(destination)
    if target == "tensorboard":
        require_library("tensorboard")
        dest.mkdir(parents=True, exist_ok=True)
        _to_tensorboard(table, meta, sheet, findings, dest, result)
    else:
        if target == "parquet":
            require_library("parquet")
        dest.parent.mkdir(parents=True, exist_ok=True)
        result.rows = export_table(table, meta, target, dest)
    if len(table.ranks()) > MAX_RANK_SERIES and target == "tensorboard":
        result.notes.append(f"{len(table.ranks())} ranks: per-rank series left out (more "
                            f"than {MAX_RANK_SERIES}); job-level series kept")
    return result
