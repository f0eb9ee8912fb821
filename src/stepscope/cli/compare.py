"""Commands of the comparison area: compare, index, scaling, eval-log.

    stepscope compare RUN_A RUN_B [--json] [--allow-multi] [--markdown] [--seed N]
                      [--repeat RUN_A2]...
    stepscope index ROOT [--markdown] [--json] [--where EXPR]... [--sort COL] [--best EXPR]
                    [--engine local|dask] [--scheduler ADDRESS]
    stepscope scaling RUN... [--json] [--markdown] [--allow-multi]
    stepscope eval-log RUN --step N --metric NAME=VALUE... [--tokens T] [--json]

Exit codes: 0 done; 1 the comparison is ``invalid`` (or a scaling study has other
differing variables) and ``--allow-multi`` was not given; 2 bad input.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..analysis.compare.quality import eval_record
from ..analysis.compare.runs import Comparison
from ..analysis.compare.scaling_efficiency import scaling
from ..errors import ConfigError
from ..proc.engine import ENGINES
from ..rundir.index import INDEX_FILE, best_config, build_index, query_index
from ..rundir.run import Run
from ..rundir.store import RunDir
from . import cli
from .common import emit_json

__all__ = ["EXIT_INVALID"]

# Exit status when a comparison is invalid without --allow-multi (2 is bad input).
EXIT_INVALID = 1


@cli.command("compare")
@click.argument("run_a", type=click.Path())
@click.argument("run_b", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
@click.option("--markdown", is_flag=True, help="Print the A/B table as Markdown.")
@click.option("--allow-multi", is_flag=True,
              help="Exit 0 even when more than one baseline variable differs.")
@click.option("--seed", type=int, default=0, show_default=True, help="Bootstrap seed.")
@click.option("--repeat", "repeats", multiple=True, type=click.Path(), metavar="RUN",
              help="Another run of RUN_A's configuration: measures run-to-run noise "
                   "(repeatable).")
@click.pass_context
def compare_cmd(ctx: click.Context, run_a: str, run_b: str, as_json: bool, markdown: bool,
                allow_multi: bool, seed: int, repeats: tuple[str, ...]) -> None:
    """Compare RUN_B against the baseline RUN_A: one variable, two ledgers, one verdict."""
    a, b = Run.open(run_a), Run.open(run_b)
    reps = [Run.open(r) for r in repeats]
    if as_json:  # the stored document when the runs are unchanged (the dashboard's too)
        doc = a.compare_doc(b, seed=seed, repeats=reps)
        emit_json(doc)
        verdict = doc["verdict"]
    else:
        result = a.compare(b, seed=seed, repeats=reps)
        _render_comparison(result, markdown)
        verdict = result.verdict
    if verdict == "invalid" and not allow_multi:
        ctx.exit(EXIT_INVALID)


def _render_comparison(result: Comparison, markdown: bool) -> None:
    if markdown:
        from ..report.markdown_tables import comparison_markdown

        click.echo(comparison_markdown(result), nl=False)
    else:
        from rich.console import Console

        from ..report.compare_view import render_comparison

        render_comparison(Console(), result)


@cli.command("index")
@click.argument("root", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Rows, skipped runs and counts as JSON.")
@click.option("--markdown", is_flag=True, help="Print the index as a Markdown table.")
@click.option("--where", "where", multiple=True, metavar="EXPR",
              help="Filter COLUMN OP VALUE, OP in = != < <= > >= ~ (repeatable).")
@click.option("--sort", default=None, metavar="COLUMN",
              help="Sort column; prefix '-' for descending (e.g. -tokens_per_s).")
@click.option("--best", default=None, metavar="EXPR[,EXPR]",
              help="Best known configuration (by MFU) for filters, e.g. "
                   "'num_params=7e9,num_devices=64'.")
@click.option("--db", type=click.Path(), default=None,
              help=f"Index file (default ROOT/{INDEX_FILE}).")
@click.option("--engine", type=click.Choice(ENGINES), default="local", show_default=True,
              help="Where changed runs are read: local processes, or Dask distributed tasks.")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="Dask scheduler (e.g. tcp://host:8786) for --engine dask; default: a new "
                   "local cluster. Its workers must see ROOT at the same path.")
def index_cmd(root: str, as_json: bool, markdown: bool, where: tuple[str, ...],
              sort: str | None, best: str | None, db: str | None, engine: str,
              scheduler: str | None) -> None:
    """Index every run under ROOT (incremental); list, filter, sort, find the best."""
    result = build_index(root, db, engine=engine, scheduler=scheduler)
    filters = list(where)
    rows: list[dict[str, Any]]
    used = None
    if best is not None:
        conds = [c for c in best.split(",") if c.strip()]
        if not conds:
            raise ConfigError("--best needs filters, e.g. 'num_params=7e9,num_devices=64'")
        row, used = best_config(result.db_path, [*filters, *conds])
        rows = [row] if row else []
    else:
        rows = query_index(result.db_path, filters, sort)
    s = result.stats
    counts = {"found": s.found, "read": s.read, "unchanged": s.unchanged,
              "removed": s.removed, "skipped": s.skipped}
    if as_json:
        emit_json({"db": str(result.db_path), "counts": counts, "best_by": used,
                   "runs": rows, "skipped": [vars(k) for k in result.skipped]})
    elif markdown:
        from ..report.markdown_tables import index_markdown

        click.echo(index_markdown(rows), nl=False)
    else:
        from rich.console import Console

        from ..report.compare_view import render_index

        title = (f"{len(rows)} run(s); index {result.db_path}: {s.read} read, "
                 f"{s.unchanged} unchanged, {s.skipped} skipped"
                 + (f"; best by {used}" if used else ""))
        render_index(Console(), rows, result.skipped, title)


@cli.command("scaling")
@click.argument("runs", nargs=-1, required=True, type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
@click.option("--markdown", is_flag=True, help="Print the table as Markdown.")
@click.option("--allow-multi", is_flag=True,
              help="Exit 0 even when variables other than the device count differ.")
@click.pass_context
def scaling_cmd(ctx: click.Context, runs: tuple[str, ...], as_json: bool, markdown: bool,
                allow_multi: bool) -> None:
    """Throughput per device and scaling efficiency of runs that differ in device count."""
    loaded = []
    for path in runs:
        run = Run.open(path)
        table = run.read()[0]
        loaded.append((run.meta.name or run.meta.run_id or Path(path).name, table, run.meta))
    result = scaling(loaded)
    if as_json:
        emit_json(result.to_dict())
    elif markdown:
        from ..report.markdown_tables import scaling_markdown

        click.echo(scaling_markdown(result), nl=False)
    else:
        from rich.console import Console

        from ..report.compare_view import render_scaling

        render_scaling(Console(), result)
    if result.differing and not allow_multi:
        ctx.exit(EXIT_INVALID)


def _parse_metric(text: str) -> tuple[str, float]:
    name, sep, value = text.partition("=")
    try:
        if not sep or not name.strip():
            raise ValueError
        return name.strip(), float(value)
    except ValueError:
        raise ConfigError(f"cannot read --metric {text!r}: expected NAME=NUMBER, "
                          "e.g. --metric val_loss=2.31") from None


@cli.command("eval-log")
@click.argument("run", type=click.Path())
@click.option("--step", type=int, required=True, help="Training step the eval belongs to.")
@click.option("--metric", "metrics", multiple=True, required=True, metavar="NAME=VALUE",
              help="An evaluation result (repeatable), e.g. val_loss=2.31.")
@click.option("--tokens", type=float, default=None, help="Tokens trained at that step.")
@click.option("--json", "as_json", is_flag=True, help="Print the stored record as JSON.")
def eval_log_cmd(run: str, step: int, metrics: tuple[str, ...], tokens: float | None,
                 as_json: bool) -> None:
    """Record evaluation results into RUN (read by compare's quality ledger)."""
    run_dir = RunDir.open(run)
    try:
        record = eval_record(step, dict(_parse_metric(m) for m in metrics), tokens)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    run_dir.append_event(record)
    if as_json:
        emit_json(record)
    else:
        shown = ", ".join(f"{k}={v:g}" for k, v in record["metrics"].items())
        click.echo(f"recorded eval at step {step} in {run_dir.path}: {shown}")
