"""`stepscope demo`: train a tiny GPT on the CPU, fully measured, and print the sheet.

With ``--slow-data`` it walks through the field report's story: step breakdown -> suspect
(data wait) -> isolation experiment (same model, data replaced by in-memory batches of
identical shape) -> verdict -> advice.
"""

from __future__ import annotations

import os
from pathlib import Path

import click
from rich.console import Console

from ..errors import ConfigError
from ..report.offline import write_html
from ..report.terminal import render_sheet
from ..rundir.run import Run
from ..rundir.store import RunDir, utc_stamp
from . import cli
from .common import emit_json
from .demo_story import isolation_story
from .demo_train import train_demo

# About a minute on a 2-core CPU at ~0.3 s per step (measured on the demo model).
DEFAULT_STEPS = 150


@cli.command("demo")
@click.option("--framework", type=click.Choice(["torch", "mindspore"]), default="torch",
              show_default=True)
@click.option("--steps", type=click.IntRange(min=5), default=DEFAULT_STEPS,
              show_default=True, help="Training steps.")
@click.option("--out", type=click.Path(path_type=Path), default=None,
              help="Run directory (default: ./stepscope-runs/demo-<UTC time>).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--slow-data", is_flag=True,
              help="Serial in-process tokenization, then the isolation experiment.")
@click.option("--peak-tflops", type=click.FloatRange(min=0, min_open=True), default=None,
              metavar="P", help="This CPU's dense fp32 peak in TFLOP/s, for the MFU where "
                                "stepscope's CPU table has no figure for it.")
@click.option("--json", "as_json", is_flag=True, help="Print the sheet as JSON at the end.")
def demo_cmd(framework: str, steps: int, out: Path | None, seed: int, slow_data: bool,
             peak_tflops: float | None, as_json: bool) -> None:
    """Train a tiny GPT on the CPU, measure everything, print the health-check sheet."""
    if peak_tflops is not None:  # this process is the demo's own: the trainer reads it
        from ..calc.hardware import PEAK_ENV

        os.environ[PEAK_ENV] = repr(peak_tflops)
    run_dir = out or Path("stepscope-runs") / f"demo-{utc_stamp()}"
    if RunDir(run_dir).steps_path(0).exists():
        raise ConfigError(f"{run_dir} already holds a run; pass another --out")
    console = Console(stderr=as_json)
    console.print(f"[bold]stepscope demo[/bold]: tiny GPT ({framework}, CPU) → {run_dir}")
    kw = {"keep_batches": 16} if slow_data else {}
    kept = train_demo(framework, run_dir, steps, seed, slow_data, as_json, "train", **kw)
    loaded = Run.open(run_dir)
    story = None
    if slow_data:  # recorded in events.jsonl, which the report's isolation view shows
        story = isolation_story(console, loaded, kept, steps, seed, as_json, framework)
        loaded = Run.open(run_dir)
    html = write_html(loaded)
    if as_json:
        d = loaded.sheet_doc()
        d["html"] = str(html)
        if story is not None:
            d["isolation"] = story.result
        emit_json(d)
        return
    render_sheet(console, loaded.sheet(), loaded.meta, loaded.findings(),
                 extra=story.renderables if story else ())
    console.print(f"Run directory: {run_dir}\nHTML report:   {html}")
