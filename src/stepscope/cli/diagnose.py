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
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from ..analysis.diagnose import Diagnosis, diagnose, records_lost
from ..analysis.isolation import (
    ISOLATION_EVENT,
    IsolationResult,
    comm_isolation_verdict,
    data_isolation_verdict,
)
from ..errors import StepscopeError
from ..rundir.results import Stored
from ..rundir.store import ReadStats, RunDir, utc_stamp
from ..schema import StepTable
from . import cli
from .common import emit_json, load_steps, no_records_error, note_event_problems

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
    rd = RunDir.open(run)
    meta = rd.read_meta()
    # A running run's silence is measured against the clock, and --trace is read from
    # outside RUN: neither is kept in the run's summary store.
    entry = Stored([rd.path], "diagnose", {}) if trace is None and meta.status != "running" \
        else None
    doc = entry.get() if entry is not None else None
    if doc is not None:
        d, stats = Diagnosis.from_stored(doc["diagnosis"]), ReadStats.from_dict(doc["stats"])
        events, ev_stats = rd.read_events()
        note_event_problems(ev_stats)
        if doc["note"]:
            click.echo(doc["note"], err=True)
    else:
        d, stats, events, note = _diagnose(rd, trace)
        if entry is not None:
            entry.put({"diagnosis": d.to_stored(), "stats": stats.to_dict(), "note": note})
    if as_json:
        emit_json({**d.to_dict(), "read": {**stats.to_dict(),
                                           "meta_problems": rd.meta_problems}})
    else:
        _render(d, run, records_lost(meta, events)[0])
        if stats.summary():
            click.echo(stats.summary())


def _diagnose(rd: RunDir, trace: Path | None
              ) -> tuple[Diagnosis, ReadStats, list[dict[str, Any]], str | None]:
    """(diagnosis, read counts, events, the note printed on stderr) of the run's records."""
    loaded = load_steps(rd.path, require=False)
    rd, meta, table, stats = loaded.run, loaded.meta, loaded.table, loaded.stats
    # A live run that has not stepped yet is diagnosed (a stall at start-up); a finished
    # one, or one whose records are all unreadable, has nothing to diagnose: exit 2.
    if not len(table) and (meta.status != "running" or loaded.stats.skipped):
        raise no_records_error(rd, loaded.stats)
    events, ev_stats = rd.read_events()
    note_event_problems(ev_stats)
    report, note = None, None
    if trace is not None:
        if not trace.exists():
            raise StepscopeError(f"--trace {trace} does not exist; pass a trace file or "
                                 "directory written by torch.profiler or MindSpore")
        report = _trace_report(trace)
    elif rd.profile_dirs():  # the newest archived profile; a broken one is only noted
        try:
            report = _trace_report(rd.profile_dirs()[-1])
        except StepscopeError as exc:
            note = f"stepscope: note: archived profile skipped: {exc}"
            click.echo(note, err=True)
    # The CLI is the edge that reads the clock: a running run's silence is a live stall.
    now = time.time() if meta.status == "running" else None
    d = diagnose(table, meta, events=events, trace_report=report, now_wall_s=now,
                 conditions=rd.read_conditions())
    return d, stats, events, note


def _run_under_stepscope(out: Path, command: tuple[str, ...], steps: int,
                         switch: str | None) -> StepTable:
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
    return load_steps(out).table


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
    base = _run_under_stepscope(base_dir, command, total, None)
    exp = _run_under_stepscope(exp_dir, command, total, switch)
    base, exp = (t.select(t["step"] >= warmup) for t in (base, exp))
    verdict = data_isolation_verdict if what == "data" else comm_isolation_verdict
    res: IsolationResult = verdict(base, exp, conditions=(
        RunDir(base_dir).read_conditions(), RunDir(exp_dir).read_conditions()))
    event = {"type": ISOLATION_EVENT, "kind": what, "result": res.to_dict(),
             "baseline_run": str(base_dir), "experiment_run": str(exp_dir),
             "warmup_steps": warmup, "measured_steps": steps}
    for d in (base_dir, exp_dir):
        RunDir.open(d).append_event(event)
    if as_json:
        emit_json(event)
        return
    click.echo(f"isolation experiment ({what}): {res.message}")
    click.echo(f"  runs: {base_dir} (as is), {exp_dir} ({label})")
    if what == "comm":
        click.echo("  note: the no-sync run did not synchronise gradients; not a valid "
                   "training run")
