"""``stepscope trace PATH [PATH2 ...]`` and ``stepscope trace diff A B``.

    stepscope trace PATH [PATH2 …] [--hta-compatible] [--steps a:b] [--top N] [--json]
                    [--engine local|dask] [--scheduler ADDRESS]
    stepscope trace diff A B [--hta-compatible] [--steps a:b] [--json]
                    [--engine local|dask] [--scheduler ADDRESS]

``--steps a:b`` names ProfilerStep numbers with both ends included (stepscope's one
convention for ``a:b``, see :mod:`stepscope._ranges`).

PATH: a PyTorch profiler trace (.json/.json.gz), a directory of per-rank traces (e.g. a
run's ``profiles/<timestamp>/``), a MindSpore profiler directory (``*_ascend_ms``), or a run
directory (its latest archived profile is used).
"""

from __future__ import annotations

from pathlib import Path

import click

from .._ranges import parse_step_range
from ..analysis.trace.breakdown import analyze
from ..errors import RunDirError
from ..proc.engine import ENGINES
from ..rundir.store import RunDir, is_run_dir
from ..schema import EventTable
from ..traces import read_trace
from . import cli
from .common import emit_json

__all__ = ["trace_group"]


class _TraceGroup(click.Group):
    """``trace PATH...`` runs the ``show`` subcommand; ``trace diff A B`` compares."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["show", *args]
        return super().parse_args(ctx, args)


def _resolve(path: Path) -> Path:
    """A run directory stands for its latest archived profile."""
    if not is_run_dir(path):
        return path
    dirs = RunDir.open(path).profile_dirs()
    if not dirs:
        raise RunDirError(f"{path} is a run directory without archived profiles "
                          "(profiles/<timestamp>/); pass a trace file or profile directory")
    return dirs[-1]


def _read(paths: list[Path], engine: str = "local", scheduler: str | None = None
          ) -> list[EventTable]:
    return read_trace([_resolve(p) for p in paths], engine=engine, scheduler=scheduler)


_hta_opt = click.option(
    "--hta-compatible", is_flag=True,
    help="Rank numbers follow HTA 0.5.0 exactly (drops the last ProfilerStep, rounds "
         "float times inward to whole µs, HTA's kernel name rules).")
_steps_opt = click.option(
    "--steps", default=None, metavar="a:b",
    help="ProfilerStep numbers to analyse, FIRST:LAST with both ends included, the "
         "convention of every a:b flag (e.g. 2:4 is steps 2, 3 and 4; 3: and :5 are open).")
_json_opt = click.option("--json", "as_json", is_flag=True, help="Print JSON.")
_engine_opt = click.option(
    "--engine", type=click.Choice(ENGINES), default="local", show_default=True,
    help="Where rank files are read: local processes, or Dask distributed tasks.")
_scheduler_opt = click.option(
    "--scheduler", default=None, metavar="ADDRESS",
    help="Dask scheduler (e.g. tcp://host:8786) for --engine dask; default: a new local "
         "cluster. Its workers must see the trace paths.")


@cli.group("trace", cls=_TraceGroup)
def trace_group() -> None:
    """Break profiler traces down: per-step phases, idle/compute/comm overlap, top ops.

    \b
    stepscope trace PATH [PATH2 ...] [--hta-compatible] [--steps a:b] [--json]
    stepscope trace diff A B [--json]
    """


@trace_group.command("show")
@click.argument("paths", nargs=-1, required=True, type=click.Path(path_type=Path))
@_hta_opt
@_steps_opt
@click.option("--top", default=10, show_default=True, help="Ops to list.")
@_json_opt
@_engine_opt
@_scheduler_opt
def show_cmd(paths: tuple[Path, ...], hta_compatible: bool, steps: str | None, top: int,
             as_json: bool, engine: str, scheduler: str | None) -> None:
    """Analyse PATH (trace file, directory of per-rank traces, or MindSpore directory)."""
    sel = parse_step_range(steps, "--steps")
    if engine == "dask":  # each rank read and analysed on a worker: no table to the client
        from ..analysis.trace.distributed import analyze_on_workers

        report = analyze_on_workers([_resolve(p) for p in paths], scheduler=scheduler,
                                    hta_compatible=hta_compatible, steps=sel, top=max(top, 20))
    else:
        report = analyze(_read(list(paths), engine, scheduler),
                         hta_compatible=hta_compatible, steps=sel, top=max(top, 20))
    if as_json:
        emit_json(report.to_dict())
        return
    # Rendering imports (rich) only when the terminal view is asked for: start-up time.
    from rich.console import Console

    from ..report.trace_view import render_trace_report

    render_trace_report(Console(), report, top=top)


@trace_group.command("diff")
@click.argument("a", type=click.Path(path_type=Path))
@click.argument("b", type=click.Path(path_type=Path))
@_hta_opt
@_steps_opt
@click.option("--top", default=20, show_default=True, help="Ops to list.")
@click.option("--by", "by", type=click.Choice(["auto", "name", "type"]), default="auto",
              show_default=True,
              help="Match ops by name or by op type (auto: by type where names carry "
                   "scopes, as MindSpore's do; a PyNative and a graph profile then match).")
@_json_opt
@_engine_opt
@_scheduler_opt
def diff_cmd(a: Path, b: Path, hta_compatible: bool, steps: str | None, top: int, by: str,
             as_json: bool, engine: str, scheduler: str | None) -> None:
    """Compare trace B against baseline A, per phase and per op (per step).

    A and B: trace files, profile directories, or run directories (latest profile)."""
    from ..analysis.trace.diff import diff_reports

    sel = parse_step_range(steps, "--steps")
    if engine == "dask":  # each side's ranks analysed on the workers, as `trace --engine dask`
        from ..analysis.trace.distributed import analyze_on_workers

        rep_a, rep_b = (analyze_on_workers([_resolve(p)], scheduler=scheduler,
                                           hta_compatible=hta_compatible, steps=sel)
                        for p in (a, b))
    else:
        rep_a = analyze(_read([a], engine, scheduler), hta_compatible=hta_compatible,
                        steps=sel)
        rep_b = analyze(_read([b], engine, scheduler), hta_compatible=hta_compatible,
                        steps=sel)
    diff = diff_reports(rep_a, rep_b, by=by)
    if as_json:
        emit_json({"a": str(a), "b": str(b), **diff.to_dict()})
        return
    from rich.console import Console

    from ..report.trace_view import render_trace_diff

    render_trace_diff(Console(), diff, top=top)
