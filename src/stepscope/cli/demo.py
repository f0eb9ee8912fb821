"""`stepscope demo`: train a tiny GPT on the CPU, fully measured, and print the sheet.

With ``--slow-data`` it walks through the field report's story: step breakdown -> suspect
(data wait) -> isolation experiment (same model, data replaced by in-memory batches of
identical shape) -> verdict -> advice.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from ..analysis.summary import summarize
from ..errors import ConfigError
from ..report.regimes_view import headline_note
from ..report.terminal import fmt_num, fmt_pct
from ..store import RunDir, utc_stamp
from . import cli
from .report import emit_json, load_run, sheet_json, write_html

# About a minute on a 2-core CPU at ~0.3 s per step (measured on the demo model).
DEFAULT_STEPS = 150


class _ProgressFeed:
    """Turns per-step metrics into a live progress line (edge code: reads the clock)."""

    def __init__(self, progress: Progress, task: Any, run_dir: Path) -> None:
        self.progress, self.task, self.run_dir = progress, task, run_dir
        self.t_last = time.perf_counter()
        self.fpt_over_peak: float | None = None
        self.n = 0

    def __call__(self, m: dict[str, float]) -> None:
        now = time.perf_counter()
        dt, self.t_last = now - self.t_last, now
        self.n += 1
        if self.n == 1:
            env = RunDir(self.run_dir).read_meta().environment
            if env.get("flops_per_token") and env.get("peak_flops_per_device"):
                self.fpt_over_peak = env["flops_per_token"] / env["peak_flops_per_device"]
        tps = m.get("tokens", 0.0) / dt if dt > 0 else 0.0
        mfu = f"{100 * tps * self.fpt_over_peak:.1f}%" if self.fpt_over_peak else "n/a"
        self.progress.update(self.task, advance=1, info=(
            f"loss {m['loss']:.3f}  now {tps:,.0f} tok/s  MFU {mfu}"))

    def finish(self) -> None:
        """End on the sheet's own headline numbers (one definition: the steady state)."""
        run = RunDir(self.run_dir)
        sheet = summarize(run.read_steps()[0], run.read_meta(),
                          conditions=run.read_conditions())
        self.progress.update(self.task, info=(
            f"{headline_note(sheet)}: {fmt_num(sheet.tokens_per_s)} tok/s  "
            f"MFU {fmt_pct(sheet.mfu)}"))


def _train(framework: str, run_dir: Path, steps: int, seed: int, slow: bool,
           quiet: bool, label: str, **kw: Any) -> Any:
    if framework == "mindspore":
        try:
            from ..demo import mindspore_gpt as mod
        except ImportError as exc:
            raise ConfigError(f"--framework mindspore needs MindSpore ({exc}); "
                              "install stepscope[mindspore]") from exc
    else:
        try:
            from ..demo import torch_gpt as mod  # type: ignore[no-redef]
        except ImportError as exc:
            raise ConfigError(f"the demo needs PyTorch ({exc}); install stepscope[torch]"
                              ) from exc
    if quiet:
        return mod.train(run_dir, steps=steps, seed=seed, slow_data=slow, **kw)
    with Progress(TextColumn(f"[bold]{label}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("{task.fields[info]}"), transient=False) as progress:
        task = progress.add_task(label, total=steps, info="")
        feed = _ProgressFeed(progress, task, run_dir)
        kept = mod.train(run_dir, steps=steps, seed=seed, slow_data=slow, on_step=feed, **kw)
        feed.finish()
        return kept


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
@click.option("--json", "as_json", is_flag=True, help="Print the sheet as JSON at the end.")
def demo_cmd(framework: str, steps: int, out: Path | None, seed: int, slow_data: bool,
             as_json: bool) -> None:
    """Train a tiny GPT on the CPU, measure everything, print the health-check sheet."""
    run_dir = out or Path("stepscope-runs") / f"demo-{utc_stamp()}"
    if RunDir(run_dir).steps_path(0).exists():
        raise ConfigError(f"{run_dir} already holds a run; pass another --out")
    console = Console(stderr=as_json)
    console.print(f"[bold]stepscope demo[/bold]: tiny GPT ({framework}, CPU) → {run_dir}")
    kw = {"keep_batches": 16} if slow_data else {}
    kept = _train(framework, run_dir, steps, seed, slow_data, as_json, "train", **kw)
    loaded = load_run(run_dir)
    sections: tuple[tuple[str, str], ...] = ()
    story = None
    if slow_data:
        from .demo_story import isolation_story

        story = isolation_story(console, loaded, kept, steps, seed, as_json, framework)
        sections = story.html_sections
        loaded = load_run(run_dir)
    html = write_html(loaded, None, sections)
    if as_json:
        d = sheet_json(loaded)
        d["html"] = str(html)
        if story is not None:
            d["isolation"] = story.result
        emit_json(d)
        return
    from ..report.terminal import render_sheet

    render_sheet(console, loaded.sheet, loaded.meta, loaded.findings,
                 extra=story.renderables if story else ())
    console.print(f"Run directory: {run_dir}\nHTML report:   {html}")
