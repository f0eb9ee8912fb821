"""The demo's `--slow-data` walk-through of the field report's method.

breakdown -> suspect -> isolation experiment (data replaced by in-memory batches of the
same shape, same model, seed and batch) -> verdict -> advice. The experiment is a real
second training run in ``<RUN>-replay``; its result is recorded in the main run's
events.jsonl so `stepscope diagnose` and `stepscope report` show it later.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from ..analysis.advice import advise
from ..analysis.isolation import ISOLATION_EVENT, data_isolation_verdict, isolation_finding
from ..report.fmt import fmt_num, fmt_pct
from ..rundir.run import Run
from ..rundir.store import RunDir
from .demo_train import train_demo

__all__ = ["Story", "isolation_story"]

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
    replay_table, _ = RunDir.open(replay_dir).read_steps()
    res = data_isolation_verdict(loaded.table, replay_table)
    loaded.dir.append_event({"type": ISOLATION_EVENT, "kind": "data",
                             "result": res.to_dict(), "experiment_run": str(replay_dir)})
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
