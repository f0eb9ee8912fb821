"""`stepscope export RUN --to tensorboard DIR | mlflow URI | csv FILE | parquet FILE`."""

from __future__ import annotations

from pathlib import Path

import click

from ..rundir.run import Run
from . import cli
from .common import emit_json

__all__ = ["export_cmd"]

_KINDS = ("tensorboard", "mlflow", "csv", "parquet")


@cli.command("export")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--to", "target", nargs=2, type=(click.Choice(_KINDS), str), required=True,
              metavar="KIND DEST",
              help="tensorboard DIR (event files for `tensorboard --logdir`), mlflow URI "
                   "(a tracking URI, e.g. sqlite:///mlflow.db; each export is a new MLflow "
                   "run), csv FILE or parquet FILE (the whole step table, one row per rank "
                   "and step; Parquet keeps run.json in its schema metadata).")
@click.option("--experiment", default="stepscope", show_default=True,
              help="MLflow experiment to log into (created if absent).")
@click.option("--json", "as_json", is_flag=True, help="Print what was written as JSON.")
def export_cmd(run: Path, target: tuple[str, str], experiment: str, as_json: bool) -> None:
    """Write RUN's records to TensorBoard, MLflow, CSV or Parquet.

    TensorBoard and MLflow get the same per-step series: result (loss, perplexity,
    accuracy; lr, grad norm, loss scale from the lowest rank), efficiency (the job's step
    time = the slowest rank's, tokens/s over all ranks), system (memory peak in GiB, data
    wait, communication), per-rank step times up to 64 ranks, and the sheet's headline
    numbers as summary/* at the last step, the baseline as params (MLflow) or a text table
    (TensorBoard), and diagnose's findings as text.
    """
    from ..report.export import export_run

    kind, dest = target
    opened = Run.open(run, fork=True)
    opened.analyse()
    result = export_run(opened.table, opened.meta, opened.sheet(), kind, dest, experiment,
                        opened.findings())
    if as_json:
        emit_json(result.to_dict())
        return
    what = f"{result.rows} rows" if result.rows else \
        f"{result.series} series, {result.points} points"
    click.echo(f"stepscope: exported {opened.path} to {kind}: {result.destination} ({what})")
    for note in result.notes:
        click.echo(f"  note: {note}")
