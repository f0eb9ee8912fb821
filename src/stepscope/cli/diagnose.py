"""CLI commands of this area: ``stepscope diagnose`` and ``stepscope isolate``.

    stepscope diagnose RUN [--trace DIR] [--json]
    stepscope isolate data|comm [--steps N] [--warmup W] [--out DIR] [--json] -- COMMAND...

``isolate`` runs COMMAND under ``stepscope run`` twice for W + N optimizer steps (as is,
then with the data loader replayed from memory / gradient sync made a no-op), compares the
steady throughput and records the verdict in both runs' events.jsonl.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from ..analysis.diagnose import Diagnosis, records_lost
from ..analysis.isolation import (
    IsolationResult,
    comm_isolation_verdict,
    data_isolation_verdict,
)
from ..errors import StepscopeError
from ..record.isolate import record_isolation
from ..rundir.run import Run
from ..rundir.store import utc_stamp
from . import cli
from .common import emit_json, note_event_problems

_MARK = {"critical": "!!", "warning": "! ", "info": "  "}
# Child-environment switches understood by `stepscope run` (integrations/torch_auto.py).
_SWITCH = {"data": ("STEPSCOPE_REPLAY_DATA", "replay-data"),
           "comm": ("STEPSCOPE_NOOP_GRAD_SYNC", "nosync-comm")}


def _trace_report(path: Path) -> Mapping[str, Any]:
    """Trace breakdown of ``path`` (file or directory), in the ``stepscope trace`` shape."""
    # Imported when a trace is there to read: the trace readers are the heaviest imports of
    # the command (start-up time of a diagnosis without a profile).
    from ..analysis.trace.breakdown import analyze
    from ..traces import read_trace

    return analyze(read_trace(path)).to_dict()


def _render(d: Diagnosis, run: Path, lost: int) -> None:
    click.echo(f"diagnosis of {run}")
    if lost:
        click.echo(f"note: {lost} records lost to a write error; the findings cover only "
                   "the recorded steps")
    click.echo(f"bottleneck: {d.bottleneck or 'none found'}")
    if not d.findings:
        click.echo("no findings")
    for f in d.findings:
        where = f" steps {f.steps[0]}-{f.steps[1]}" if f.steps else ""
        where += f" rank {f.rank}" if f.rank is not None else ""
        click.echo(f"{_MARK[f.severity]} [{f.severity}] {f.category}{where}: {f.message}")
        if f.recommendation and f.severity != "info":
            click.echo(f"     next: {f.recommendation}")
    if d.advice:
        click.echo("advice (payoff order):")
        for a in d.advice:
            line = f"  - [{a.stage}] {a.knob}: {a.change} -> {a.expected_effect}"
            click.echo(line + (f" (caution: {a.caution})" if a.caution else ""))


@cli.command("diagnose")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--trace", "trace", type=click.Path(path_type=Path), default=None,
              help="profiler trace (file or directory) to add to the diagnosis")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
def diagnose_cmd(run: Path, trace: Path | None, as_json: bool) -> None:
    """Ranked findings, the bottleneck and the next experiment for run directory RUN."""
    opened = Run.open(run)
    if trace is None:
        d = opened.diagnosis()
        if opened.diagnosis_note:
            click.echo(opened.diagnosis_note, err=True)
    else:  # a trace from outside RUN: not the run's own diagnosis, never stored
        d = _with_trace(opened, trace)
    note_event_problems(opened)
    stats = opened.stats
    if as_json:
        emit_json({**d.to_dict(), "read": {**stats.to_dict(),
                                           "meta_problems": opened.meta_problems}})
    else:
        _render(d, run, records_lost(opened.meta, opened.events())[0])
        if stats.summary():
            click.echo(stats.summary())


def _with_trace(run: Run, trace: Path) -> Diagnosis:
    """The diagnosis of the run's records with ``trace``'s breakdown instead of the
    archived profile's."""
    if not trace.exists():
        raise StepscopeError(f"--trace {trace} does not exist; pass a trace file or "
                             "directory written by torch.profiler or MindSpore")
    return run.diagnosis(trace_report=_trace_report(trace))


def _run_under_stepscope(out: Path, command: tuple[str, ...], steps: int,
                         switch: str | None) -> Run:
    env = dict(os.environ, STEPSCOPE_MAX_STEPS=str(steps))
    env.pop("STEPSCOPE_REPLAY_DATA", None)
    env.pop("STEPSCOPE_NOOP_GRAD_SYNC", None)
    if switch:
        env[switch] = "1"
    argv = [sys.executable, "-m", "stepscope", "run", "--out", str(out), "--", *command]
    proc = subprocess.run(argv, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise StepscopeError(f"`{' '.join(command)}` under stepscope run exited with "
                             f"{proc.returncode} ({' | '.join(tail)}); run it alone first")
    return Run.open(out)


@cli.command("isolate")
@click.argument("what", type=click.Choice(["data", "comm"]))
@click.option("--steps", default=30, show_default=True, type=click.IntRange(min=1),
              help="steps measured after warm-up in each run")
@click.option("--warmup", default=5, show_default=True, type=click.IntRange(min=0),
              help="steps run first and not measured")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="directory for the two runs (default runs/isolate-WHAT-<UTC>)")
@click.option("--json", "as_json", is_flag=True, help="machine-readable output")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def isolate_cmd(what: str, steps: int, warmup: int, out: Path | None, as_json: bool,
                command: tuple[str, ...]) -> None:
    """Prove a suspect: run COMMAND as is and with the data pipeline (data) or gradient
    sync (comm) removed, then compare throughput. The comm run is not a valid training run."""
    out = out or Path("runs") / f"isolate-{what}-{utc_stamp()}"
    switch, label = _SWITCH[what]
    base_dir, exp_dir = out / "baseline", out / label
    total = warmup + steps
    base_run = _run_under_stepscope(base_dir, command, total, None)
    exp_run = _run_under_stepscope(exp_dir, command, total, switch)
    base, exp = (r.read()[0] for r in (base_run, exp_run))
    base, exp = (t.select(t["step"] >= warmup) for t in (base, exp))
    verdict = data_isolation_verdict if what == "data" else comm_isolation_verdict
    res: IsolationResult = verdict(base, exp, conditions=(base_run.conditions,
                                                          exp_run.conditions))
    event = record_isolation(base_dir, res, exp_dir, warmup_steps=warmup,
                             measured_steps=steps)
    exp_run.dir.append_event(event)  # the same record in both runs
    if as_json:
        emit_json(event)
        return
    click.echo(f"isolation experiment ({what}): {res.message}")
    click.echo(f"  runs: {base_dir} (as is), {exp_dir} ({label})")
    if what == "comm":
        click.echo("  note: the no-sync run did not synchronise gradients; not a valid "
                   "training run")
