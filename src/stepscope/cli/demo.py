"""`stepscope demo`: train a tiny GPT on the CPU, fully measured, and print the sheet.

With ``--slow-data`` it walks through the field report's story (:func:`isolation_story`):
step breakdown -> suspect (data wait) -> isolation experiment (same model, data replaced
by in-memory batches of identical shape) -> verdict -> advice. The experiment is a real
second training run in ``<RUN>-replay``; its result is recorded in the main run's
events.jsonl so `stepscope diagnose` and `stepscope report` show it later. Both runs
train through :func:`train_demo`, which picks the framework's demo model and shows the
live progress line.
"""

from __future__ import annotations

import dataclasses
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from ..analysis.advice import advise
from ..analysis.isolation import data_isolation_verdict, isolation_finding
from ..analysis.mfu import run_mfu
from ..errors import ConfigError
from ..record.isolate import record_isolation
from ..report.fmt import fmt_num, fmt_pct
from ..report.offline import write_html
from ..report.regimes_view import headline_note
from ..report.terminal import render_sheet
from ..rundir.run import Run
from ..rundir.store import RunDir, utc_stamp
from ..schema import RunMeta
from . import cli
from .common import emit_json

__all__ = ["demo_cmd", "isolation_story", "Story", "train_demo"]

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


# The replay run is shorter than the main one: enough steady steps for a verdict.
_REPLAY_STEPS = 30


@dataclass
class Story:
    result: dict[str, Any]
    renderables: list[Any] = field(default_factory=list)


def _say(console: Console, text: str) -> None:
    console.print(text)  # stderr under --json, so stdout stays machine-readable


def isolation_story(console: Console, loaded: Run, kept: list[Any], steps: int,
                    seed: int, quiet: bool, framework: str = "torch") -> Story:
    """Run the isolation experiment for the demo's slow-data run and narrate it.

    ``quiet`` hides the replay run's progress bar (``--json``); the story is always told.
    """
    s = loaded.sheet()
    _say(console, "\n[bold]1. Step breakdown[/bold]: " + ", ".join(
        f"{p} {fmt_pct(f)}" for p, f in s.phase_frac.items()))
    _say(console,
         f"[bold]2. Suspect[/bold]: the device waits for data {fmt_pct(s.data_wait_frac)} "
         "of the step (health threshold: 5%) → the data pipeline")
    replay_dir = Path(f"{loaded.path}-replay")
    _say(console,
         f"[bold]3. Isolation experiment[/bold]: same model, seed and batch shape; data "
         f"replaced by {len(kept)} real batches held in memory → {replay_dir}")
    train_demo(framework, replay_dir, min(steps, _REPLAY_STEPS), seed, False, quiet, "replay",
               batches=kept)
    replay_table, _ = Run.open(replay_dir).read()
    res = data_isolation_verdict(loaded.table, replay_table)
    record_isolation(loaded.path, res, replay_dir)
    _say(console,
         f"[bold]4. Verdict[/bold]: {res.verdict} — {fmt_num(res.baseline_rate)} → "
         f"{fmt_num(res.experiment_rate)} {res.unit}; the pipeline costs "
         f"{fmt_pct(res.share)} of the time. {res.message}")
    finding = isolation_finding(res)
    if res.verdict == "minor":  # advice is for warnings; a minor cost still has its fix
        finding = dataclasses.replace(finding, severity="warning")
    advice = advise([finding], loaded.meta, framework) if res.verdict in (
        "bottleneck", "minor") else []
    lead = ("[bold]5. Next single change[/bold]" if res.verdict == "bottleneck" else
            f"[bold]5. A minor cost ({fmt_pct(res.share)})[/bold], worth fixing after the "
            "larger phases")
    for i, a in enumerate(advice[:3]):
        head = lead if i == 0 else "   then"
        _say(console, f"{head}: {a.knob} — {a.change} (expected: "
                      f"{a.expected_effect})")
    if not advice:
        _say(console, "[bold]5. Advice[/bold]: the data pipeline is not the "
                      "bottleneck; look at the next phase of the breakdown")
    return Story(result={**res.to_dict(), "experiment_run": str(replay_dir),
                         "advice": [a.to_dict() for a in advice]})


class _ProgressFeed:
    """Turns per-step metrics into a live progress line (edge code: reads the clock)."""

    def __init__(self, progress: Progress, task: Any, run_dir: Path) -> None:
        self.progress, self.task, self.run_dir = progress, task, run_dir
        self.t_last = time.perf_counter()
        self.meta: RunMeta | None = None
        self.n = 0

    def __call__(self, m: dict[str, float]) -> None:
        now = time.perf_counter()
        dt, self.t_last = now - self.t_last, now
        self.n += 1
        if self.n == 1:  # run.json holds FLOPs per token and the peak once training starts
            self.meta = RunDir(self.run_dir).read_meta()
        tps = m.get("tokens", 0.0) / dt if dt > 0 else 0.0
        mfu = run_mfu(tps, self.meta)[0]
        shown = f"{100 * mfu:.1f}%" if mfu is not None else "n/a"
        self.progress.update(self.task, advance=1, info=(
            f"loss {m['loss']:.3f}  now {tps:,.0f} tok/s  MFU {shown}"))

    def finish(self) -> None:
        """End on the sheet's own headline numbers (one definition: the steady state)."""
        sheet = Run.open(self.run_dir).sheet()
        self.progress.update(self.task, info=(
            f"{headline_note(sheet)}: {fmt_num(sheet.tokens_per_s)} tok/s  "
            f"MFU {fmt_pct(sheet.mfu)}"))


def train_demo(framework: str, run_dir: Path, steps: int, seed: int, slow: bool,
               quiet: bool, label: str, **kw: Any) -> Any:
    """Train the demo model of ``framework`` into ``run_dir``; ``quiet`` hides the bar.

    Returns what the demo's ``train`` returns (the batches it kept for a replay run).
    """
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
