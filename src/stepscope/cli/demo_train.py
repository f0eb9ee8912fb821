"""The demo's training driver: picks the framework's demo model and shows live progress.

Both the demo command (``cli/demo.py``) and its isolation story (``cli/demo_story.py``)
train through :func:`train_demo`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

from ..analysis.summary import run_mfu, summarize
from ..errors import ConfigError
from ..report.fmt import fmt_num, fmt_pct
from ..report.regimes_view import headline_note
from ..rundir.store import RunDir
from ..schema import RunMeta

__all__ = ["train_demo"]


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
        run = RunDir(self.run_dir)
        sheet = summarize(run.read_steps()[0], run.read_meta(),
                          conditions=run.read_conditions())
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
