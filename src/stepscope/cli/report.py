"""`stepscope report RUN [--html FILE] [--json]`: the health-check sheet of a run."""

from __future__ import annotations

from pathlib import Path

import click

from . import cli
from .common import emit_json
from .sheet import load_run, sheet_json, write_html

# emit_json is re-exported: cli/calc.py imported it from here before cli/common.py existed.
__all__ = ["emit_json"]


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
    loaded = load_run(run, flops_convention)
    html_path = None if no_html and html_out is None else write_html(loaded, html_out)
    if as_json:
        d = sheet_json(loaded)
        d["html"] = str(html_path) if html_path else None
        emit_json(d)
        return
    from rich.console import Console

    from ..report.terminal import render_sheet

    console = Console()
    render_sheet(console, loaded.sheet, loaded.meta, loaded.findings)
    if html_path:
        console.print(f"HTML report: {html_path}")
