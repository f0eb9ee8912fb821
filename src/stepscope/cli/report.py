"""`stepscope report RUN [--html FILE] [--json]`: the health-check sheet of a run."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import orjson
from rich.console import Console
from rich.text import Text

from ..analysis.diagnose import records_lost
from ..analysis.findings import Finding, severity_rank
from ..analysis.summary import Sheet, summarize
from ..errors import StepscopeError
from ..schema import RunMeta, StepTable
from ..store import EVENTS_JSONL, STEPS_DIR, ReadStats, RunDir
from . import cli

__all__ = ["LoadedRun", "load_run", "write_html", "emit_json", "no_records_error",
           "note_event_problems"]


@dataclass
class LoadedRun:
    run: RunDir
    meta: RunMeta
    table: StepTable
    stats: ReadStats
    sheet: Sheet
    findings: list[Finding]
    events: list[dict[str, Any]]


def _findings(table: StepTable, meta: RunMeta, events: list[dict[str, Any]]) -> list[Finding]:
    try:
        from ..analysis.diagnose import diagnose
    except ImportError:  # diagnosis not available in this build
        return []
    result = diagnose(table, meta, events=events)
    return sorted(result.findings, key=lambda f: severity_rank(f.severity))


def no_records_error(run: RunDir, stats: ReadStats) -> StepscopeError:
    """Why a run has no readable step records, as the one-line error the CLI prints."""
    steps = run.path / STEPS_DIR
    try:
        os.listdir(steps)
    except FileNotFoundError:
        return StepscopeError(f"{run.path} has no {STEPS_DIR}/ directory: no step was "
                              "recorded; is the training loop calling rec.step() / running "
                              "under `stepscope run`?")
    except OSError as exc:
        return StepscopeError(f"cannot read {steps}: {exc.strerror}; give this user read "
                              "access to the run directory")
    if stats.skipped:
        return StepscopeError(f"{run.path} has no readable step records: {stats.skipped} "
                              f"unreadable record(s) in {stats.files} file(s), first: "
                              f"{stats.problems[0] if stats.problems else '?'}")
    return StepscopeError(
        f"{run.path} has no step records yet ({stats.files} step file(s)); is the training "
        "loop calling rec.step() / running under `stepscope run`?")


def load_run(path: str | Path) -> LoadedRun:
    """Open, read and analyse a run directory (raises RunDirError on bad input)."""
    run = RunDir.open(path)
    meta = run.read_meta()
    table, stats = run.read_steps()
    if not len(table):
        raise no_records_error(run, stats)
    events, ev_stats = run.read_events()
    note_event_problems(ev_stats)
    sheet = summarize(table, meta, skipped_records=stats.skipped)
    return LoadedRun(run, meta, table, stats, sheet, _findings(table, meta, events), events)


def note_event_problems(stats: ReadStats) -> None:
    """One stderr line when events.jsonl had records that could not be read."""
    if stats.skipped:
        first = f"; first: {stats.problems[0]}" if stats.problems else ""
        click.echo(f"stepscope: note: {stats.skipped} corrupt record(s) in {EVENTS_JSONL} "
                   f"skipped{first}", err=True)


def write_html(loaded: LoadedRun, out: Path | None = None,
               sections: tuple[tuple[str, str], ...] = ()) -> Path:
    from ..report.html import render_html

    path = out or loaded.run.report_path
    text = render_html(loaded.sheet, loaded.meta, loaded.table, loaded.findings, sections)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise StepscopeError(f"cannot write {path}: {exc}") from exc
    return path


def _html_somewhere(loaded: LoadedRun, out: Path | None) -> tuple[Path | None, str | None]:
    """(where the HTML went, a note). RUN/report.html, or beside the temp files when RUN
    is read-only; an explicit ``--html`` that fails is an error (raised by write_html)."""
    if out is not None:
        return write_html(loaded, out), None
    try:
        return write_html(loaded), None
    except StepscopeError as exc:
        spare = Path(tempfile.gettempdir()) / f"stepscope-report-{loaded.meta.run_id}.html"
        try:
            return write_html(loaded, spare), f"{exc}; wrote it to {spare} instead"
        except StepscopeError as exc2:
            return None, f"{exc}; {exc2}; no HTML report written (pass --html FILE)"


def emit_json(obj: Any) -> None:
    sys.stdout.buffer.write(orjson.dumps(obj, option=orjson.OPT_INDENT_2
                                         | orjson.OPT_SERIALIZE_NUMPY, default=str) + b"\n")
    sys.stdout.flush()


def sheet_json(loaded: LoadedRun) -> dict[str, Any]:
    d = loaded.sheet.to_dict()
    d["run"] = {"path": str(loaded.run.path), "run_id": loaded.meta.run_id,
                "name": loaded.meta.name, "status": loaded.meta.status,
                "error": loaded.meta.error}
    d["findings"] = [f.to_dict() for f in loaded.findings]
    d["read_problems"] = loaded.stats.problems
    d["records_lost"], d["write_error"] = records_lost(loaded.meta, loaded.events)
    return d


@cli.command("report")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--html", "html_out", type=click.Path(path_type=Path), default=None,
              help="Write the self-contained HTML report here (default: RUN/report.html).")
@click.option("--json", "as_json", is_flag=True, help="Print the sheet as JSON.")
@click.option("--no-html", is_flag=True, help="Do not write report.html.")
def report_cmd(run: Path, html_out: Path | None, as_json: bool, no_html: bool) -> None:
    """Print the health-check sheet of RUN (a run directory)."""
    loaded = load_run(run)
    html_path, html_note = None, None
    if not (no_html and html_out is None):
        html_path, html_note = _html_somewhere(loaded, html_out)
    if html_note:
        click.echo(f"stepscope: note: {html_note}", err=True)
    if as_json:
        d = sheet_json(loaded)
        d["html"] = str(html_path) if html_path else None
        emit_json(d)
        return
    from ..report.terminal import render_sheet

    console = Console()
    render_sheet(console, loaded.sheet, loaded.meta, loaded.findings)
    lost, first = records_lost(loaded.meta, loaded.events)
    if lost:
        console.print(Text(f"{lost} records lost to a write error"
                           + (f" ({first})" if first else ""), style="yellow"))
    if html_path:
        console.print(Text(f"HTML report: {html_path}"))
