"""``stepscope watch PATH``: follow a run (or every run under a root) from outside.

PATH is a run directory (the watch ends when the run does) or a root of runs (new runs are
picked up as they appear; it runs until interrupted). Alerts go to the alert file's sinks
from this process's sender thread and into each run's events.jsonl, marked
``"observer": "watch"``; ``emit`` (the CLI's printer) sees each one first. When a rank's
process is found gone, the alerts that process recorded as pending (it was killed before
sending them) are delivered from here (:func:`~stepscope.alerts.pending.flush_pending`).

Example::

    code = watch_path("runs/exp1", load_alerts_config("alerts.toml"), stall_after_s=600,
                      emit=lambda a: print(a.headline()))
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ..errors import RunDirError
from ..rundir.store import RunDir, is_run_dir
from .config import AlertsConfig
from .delivery import Dispatcher
from .follow import RunWatcher
from .model import Alert
from .pending import flush_pending, journal_fields

__all__ = ["watch_path", "find_runs"]

# A root is searched for new runs this often (seconds): cheap, and a new job's first
# minute is warm-up anyway.
_DISCOVER_EVERY_S = 10.0


def find_runs(root: Path, depth: int = 2) -> list[Path]:
    """Run directories at or under ``root``, at most ``depth`` levels down."""
    if is_run_dir(root):
        return [root]
    if depth <= 0 or not root.is_dir():
        return []
    out: list[Path] = []
    try:
        children = sorted(p for p in root.iterdir() if p.is_dir())
    except OSError:
        return []
    for child in children:
        out.extend(find_runs(child, depth - 1))
    return out


def _flush(run: RunDir, config: AlertsConfig) -> None:
    """Deliver what a killed process left pending (its own alert file if ours has no sinks)."""
    try:
        flush_pending(run, config if config.sinks else None, timeout_s=30.0,
                      observer="watch")
    except Exception as exc:  # the watch goes on: the alerts stay pending for a later flush
        print(f"stepscope watch: pending alerts not delivered: {type(exc).__name__}",
              file=sys.stderr)


class _Recorder:
    """Routes each alert record to its run's events.jsonl."""

    def __init__(self) -> None:
        self.runs: dict[str, RunDir] = {}

    def __call__(self, event: Mapping[str, Any]) -> None:
        run = self.runs.get(str(event.get("run")))
        if run is not None:
            run.append_event({**event, "observer": "watch"})


def watch_path(path: str | Path, config: AlertsConfig, stall_after_s: float,
               emit: Callable[[Alert], None], poll_s: float = 1.0,
               max_s: float | None = None) -> int:
    """Watch until the run ends (0 finished, 1 failed or gone) or, for a root, forever."""
    root = Path(path)
    if not root.exists():
        raise RunDirError(f"{root}: no such run directory or root of runs")
    single = is_run_dir(root)
    record = _Recorder()
    dispatcher = Dispatcher(config.sinks, record=record, cooldown_s=config.rules.cooldown_s,
                            journal={**journal_fields(config.source), "observer": "watch"})
    watchers: dict[Path, RunWatcher] = {}
    start = time.monotonic()
    next_discover = start
    try:
        while True:
            now = time.monotonic()
            if now >= next_discover:
                for p in find_runs(root):
                    if p not in watchers:
                        w = RunWatcher(RunDir(p), config.rules, stall_after_s)
                        watchers[p] = w
                        record.runs[w.name] = w.run
                next_discover = now + _DISCOVER_EVERY_S
            for w in list(watchers.values()):
                if w.done:
                    continue
                found = w.poll(now, time.time())
                for alert in found:
                    emit(alert)
                    dispatcher.submit(alert)
                if any(a.rule == "process_gone" for a in found):
                    _flush(w.run, config)
            if single and all(w.done for w in watchers.values()):
                return 0 if all(w.status == "finished" for w in watchers.values()) else 1
            if max_s is not None and now - start >= max_s:
                return 0
            time.sleep(poll_s)
    finally:
        dispatcher.close(timeout_s=10.0)
