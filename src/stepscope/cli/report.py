"""`stepscope report RUN [--html FILE] [--json]`: the health-check sheet of a run."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from ..analysis.diagnose import records_lost
from ..errors import StepscopeError
from ..rundir.run import REPORT_POINTS, Run
from . import cli
from .common import emit_json, note_event_problems

# emit_json is re-exported: cli/calc.py imported it from here before cli/common.py existed.
__all__ = ["emit_json"]


def _html_somewhere(run: Run, out: Path | None) -> tuple[Path | None, str | None]:
    """(where the HTML went, a note). RUN/report.html, or, when RUN is read-only, a new
    private (0700) folder among the temp files: its path never comes from the run's data
    (a run_id of "/../x" once chose the file written); an explicit ``--html`` that fails is
    an error (raised by write_html)."""
    from ..report.offline import write_html

    if out is not None:
        return write_html(run, out), None
    try:
        return write_html(run), None
    except StepscopeError as exc:
        try:
            spare = Path(tempfile.mkdtemp(prefix="stepscope-report-")) / "report.html"
        except OSError as exc2:
            return None, f"{exc}; {exc2}; no HTML report written (pass --html FILE)"
        try:
            return write_html(run, spare), f"{exc}; wrote it to {spare} instead"
        except StepscopeError as exc2:
            return None, f"{exc}; {exc2}; no HTML report written (pass --html FILE)"


@cli.command("report")
@click.argument("run", type=click.Path(path_type=Path))
@click.option("--html", "html_out", type=click.Path(path_type=Path), default=None,
              help="Write the self-contained HTML report here (default: RUN/report.html).")
@click.option("--json", "as_json", is_flag=True, help="Print the sheet as JSON.")
@click.option("--no-html", is_flag=True, help="Do not write report.html.")
@click.option("--flops-convention", default=None, metavar="NAME",
              help="MFU under this FLOPs convention, as recorded by `stepscope run` "
                   "(matmul, palm, torchtitan, 6n, megatron, megatron-2022).")
def report_cmd(run: Path, html_out: Path | None, as_json: bool, no_html: bool,
               flops_convention: str | None) -> None:
    """Print the health-check sheet of RUN (a run directory)."""
    page = not (no_html and html_out is None)
    opened = Run.open(run, flops_convention=flops_convention, fork=True)
    opened.analyse(series_points=REPORT_POINTS if page else None)
    note_event_problems(opened)
    html_path, html_note = None, None
    if page:
        html_path, html_note = _html_somewhere(opened, html_out)
    if html_note:
        click.echo(f"stepscope: note: {html_note}", err=True)
    if as_json:
        d = opened.sheet_doc()
        d["html"] = str(html_path) if html_path else None
        emit_json(d)
        return
    from rich.console import Console
    from rich.text import Text

    from ..report.terminal import render_sheet

    console = Console()
    render_sheet(console, opened.sheet(), opened.meta, opened.findings())
    if opened.stats.summary():
        console.print(opened.stats.summary(), style="yellow", markup=False)
    lost, first = records_lost(opened.meta, opened.events())
    if lost:
        console.print(Text(f"{lost} records lost to a write error"
                           + (f" ({first})" if first else ""), style="yellow"))
    if html_path:
        console.print(Text(f"HTML report: {html_path}"))
