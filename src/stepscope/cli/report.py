"""`stepscope report RUN [--html FILE] [--json]`: the health-check sheet of a run."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
import orjson
from rich.console import Console

from ..analysis.findings import Finding, severity_rank
from ..analysis.summary import Conditions, Sheet, summarize
from ..errors import StepscopeError
from ..schema import RunMeta, StepTable
from ..store import ReadStats, RunDir
from . import cli

__all__ = ["LoadedRun", "load_run", "write_html", "emit_json"]


@dataclass
class LoadedRun:
    run: RunDir
    meta: RunMeta
    table: StepTable
    stats: ReadStats
    sheet: Sheet
    findings: list[Finding]
    events: list[dict[str, Any]]


def _findings(table: StepTable, meta: RunMeta, events: list[dict[str, Any]],
              conditions: Conditions) -> list[Finding]:
    try:
        from ..analysis.diagnose import diagnose
    except ImportError:  # diagnosis not available in this build
        return []
    result = diagnose(table, meta, events=events, conditions=conditions)
    return sorted(result.findings, key=lambda f: severity_rank(f.severity))


def load_run(path: str | Path) -> LoadedRun:
    """Open, read and analyse a run directory (raises RunDirError on bad input)."""
    run = RunDir.open(path)
    meta = run.read_meta()
    table, stats = run.read_steps()
    if not len(table):
        raise StepscopeError(
            f"{run.path} has no step records yet ({stats.files} step file(s), "
            f"{stats.skipped} unreadable record(s)); is the training loop calling "
            "rec.step()/stepscope run instrumentation?")
    events, _ = run.read_events()
    conditions = run.read_conditions()
    sheet = summarize(table, meta, skipped_records=stats.skipped, conditions=conditions)
    return LoadedRun(run, meta, table, stats, sheet,
                     _findings(table, meta, events, conditions), events)


def write_html(loaded: LoadedRun, out: Path | None = None,
               sections: tuple[tuple[str, str], ...] = ()) -> Path:
    from ..report.html import render_html
    from ..report.profile_view import profile_html
    from ..report.serve_data import latest_profile

    path = out or loaded.run.report_path
    profile = profile_html(latest_profile(loaded.run))
    if profile:
        sections = (*sections, ("Latest profile", profile))
    text = render_html(loaded.sheet, loaded.meta, loaded.table, loaded.findings, sections)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise StepscopeError(f"cannot write {path}: {exc}") from exc
    return path


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
    html_path = None if no_html and html_out is None else write_html(loaded, html_out)
    if as_json:
        d = sheet_json(loaded)
        d["html"] = str(html_path) if html_path else None
        emit_json(d)
        return
    from ..report.terminal import render_sheet

    console = Console()
    render_sheet(console, loaded.sheet, loaded.meta, loaded.findings)
    if html_path:
        console.print(f"HTML report: {html_path}")
