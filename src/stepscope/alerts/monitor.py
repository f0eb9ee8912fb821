"""The in-process live half: rules on the writer thread, the stall watchdog, delivery.

The plug board (``stepscope.plugs``) starts :func:`alerts_plug` and :func:`metrics_plug` on
a recorder configured for them: the live rules see the step records on the writer thread,
after each batch is written (the training thread's hot path does not change); the stall
watchdog and the sender thread start with the plug. Nothing it does can raise into training
after it started; a bad alert file raises before (explicit ``alerts=``) or is warned about
and ignored (``STEPSCOPE_ALERTS`` picked up by an entry point that cannot stop).

Example::

    rec = stepscope.Recorder("runs/exp1", alerts="alerts.toml")   # starts alerts_plug
"""

from __future__ import annotations

import os
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, Protocol

from ..errors import StepscopeError
from ..plugs import ALERTS_ENV, PlugContext, metrics_port
from ..rundir.store import RunDir
from .config import AlertsConfig, load_alerts_config
from .delivery import CLOSE_WAIT_S, Dispatcher
from .metrics import MetricsExporter, flops_from_meta
from .model import Alert
from .pending import journal_fields
from .ranks import StragglerRule
from .rules import LiveRules
from .tail import JsonlTail
from .watchdog import StallWatchdog

__all__ = ["LiveMonitor", "attach", "alerts_plug", "metrics_plug", "ENV_VAR"]

ENV_VAR = ALERTS_ENV


class _Recorder(Protocol):
    rank: int
    run: RunDir

    @property
    def steps_recorded(self) -> int: ...

    def add_listener(self, fn: Callable[[list[dict[str, Any]]], None]) -> None: ...


class LiveMonitor:
    """Live rules + stall watchdog + dispatcher for one rank of one run."""

    def __init__(self, config: AlertsConfig, run: RunDir, rank: int,
                 progress: Callable[[], int], thread_ident: int,
                 wall: Callable[[], float] = time.time) -> None:
        self.config = config
        try:
            meta = run.read_meta()
            name = meta.name or meta.run_id
        except Exception:  # rank 0 may not have written run.json yet
            name = run.path.name
        self.rules = LiveRules(config.rules, name, rank)
        # This rank's condition samples, written by the same writer thread just before the
        # rules run (the conditions log listens first): the environment rules read them.
        cond = run.conditions_path(rank)
        self._conditions = JsonlTail(cond, offset=cond.stat().st_size if cond.exists() else 0)
        # Rank 0 (which sends to the chat sinks) also judges the cross-rank views its merge
        # thread appends to events.jsonl: every rank's straggler score of each exchange.
        self._stragglers: StragglerRule | None = None
        if rank == 0 and "straggler" not in config.rules.disable:
            self._stragglers = StragglerRule(name, config.rules.consecutive)
            ev = run.events_path
            self._events = JsonlTail(ev, offset=ev.stat().st_size if ev.exists() else 0)
        sinks = [s for s in config.sinks if rank == 0 or s.all_ranks or s.type == "console"]
        self.dispatcher = Dispatcher(sinks, record=run.append_event,
                                     cooldown_s=config.rules.cooldown_s,
                                     journal=journal_fields(config.source))
        self._wall = wall
        self.on_alert: Callable[[Alert], None] | None = None  # e.g. the metrics counter
        self.watchdog: StallWatchdog | None = None
        if "stall" not in config.rules.disable:
            self.watchdog = StallWatchdog(progress, thread_ident, self.stall_limit_s,
                                          self.submit, name, rank, wall=wall)
            self.watchdog.start()

    def stall_limit_s(self) -> float:
        """The alert file's ``stall_after_s``; else stall_factor x steady median, floored."""
        r = self.config.rules
        if r.stall_after_s > 0:
            return r.stall_after_s
        med = self.rules.steady_median_s()
        return max(r.stall_min_s, self.rules.health.stall_factor * med if med else 0.0)

    def on_records(self, records: list[dict[str, Any]]) -> None:
        """Listener for the recorder's writer thread: each record through the rules."""
        now = self._wall()
        for sample in self._conditions.read():
            self.rules.observe_conditions(sample)
        for rec in records:
            for alert in self.rules.observe(rec, now):
                self.submit(alert)
        if self._stragglers is not None:
            for ev in self._events.read():  # what was appended since the last batch
                if ev.get("type") == "cross_rank":
                    for alert in self._stragglers.observe(ev, now):
                        self.submit(alert)

    def submit(self, alert: Alert) -> None:
        if self.on_alert is not None:
            self.on_alert(alert)
        self.dispatcher.submit(alert)

    def close(self, status: str = "finished", timeout_s: float = CLOSE_WAIT_S) -> None:
        """Stop the watchdog; give delivery at most ``timeout_s`` (the rest stays pending).
        ``status`` (the plug protocol's) changes nothing: alerts were sent as they fired."""
        if self.watchdog is not None:
            self.watchdog.stop()
        self.dispatcher.close(timeout_s)


def _config(alerts: str | os.PathLike[str] | None) -> AlertsConfig | None:
    if alerts is not None:
        return load_alerts_config(alerts)  # a mistake raises: the caller asked for it
    path = os.environ.get(ENV_VAR)
    if not path:
        return None
    try:
        return load_alerts_config(path)
    except Exception as exc:  # from the environment: report, never stop the job
        warnings.warn(f"stepscope: alerts disabled: {exc}", RuntimeWarning, stacklevel=3)
        return None


def attach(rec: _Recorder, alerts: str | os.PathLike[str] | None = None
           ) -> LiveMonitor | None:
    """Attach live alerts to a recorder made without them, from ``alerts`` or
    ``$STEPSCOPE_ALERTS``; else None. Close the result after the recorder."""
    monitor = alerts_plug(PlugContext(run=rec.run, rank=rec.rank,
                                      progress=lambda: rec.steps_recorded, alerts=alerts))
    if monitor is not None:
        rec.add_listener(monitor.on_records)
    return monitor


def _exporter(run: RunDir, rank: int, port: int, explicit: bool) -> MetricsExporter | None:
    local = os.environ.get("LOCAL_RANK", "0")
    try:
        meta = run.read_meta()
        name = meta.name or meta.run_id
    except Exception:
        name = run.path.name

    def flops() -> tuple[float, float] | None:
        try:
            return flops_from_meta(run.read_meta().environment)
        except Exception:
            return None

    try:
        return MetricsExporter(port, name, rank, int(local) if local.isdigit() else 0,
                               flops=flops)
    except StepscopeError as exc:
        if explicit:
            raise
        warnings.warn(f"stepscope: metrics disabled: {exc}", RuntimeWarning, stacklevel=3)
        return None


def alerts_plug(ctx: PlugContext) -> LiveMonitor | None:
    """The plug board's ``alerts``: live alerts from ``Recorder(alerts=)`` or
    ``$STEPSCOPE_ALERTS``; None when neither names a file."""
    config = _config(ctx.alerts)
    if config is None:
        return None
    # The factory runs in the Recorder's constructor: this is the training thread, the one
    # the stall watchdog samples.
    return LiveMonitor(config, ctx.run, ctx.rank, ctx.progress, threading.get_ident())


def metrics_plug(ctx: PlugContext) -> MetricsExporter | None:
    """The plug board's ``metrics``: Prometheus ``/metrics`` on ``Recorder(metrics_port=)``
    or ``$STEPSCOPE_METRICS_PORT`` (+ local rank), counting the ``alerts`` plug's alerts.
    An explicit port that cannot be served raises; one from the environment warns."""
    port = metrics_port(ctx.metrics_port)
    if port is None:
        return None
    exporter = _exporter(ctx.run, ctx.rank, port, explicit=ctx.metrics_port is not None)
    monitor = ctx.started.get("alerts")
    if exporter is not None and isinstance(monitor, LiveMonitor):
        monitor.on_alert = exporter.on_alert
    return exporter
