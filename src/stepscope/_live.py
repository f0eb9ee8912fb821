"""The recorder's door to the live half: a ``process`` record, alerts, metrics (opt-in).

Every recorder appends ``{"type": "process", "rank", "pid", "hostname"}`` to events.jsonl
when it starts, so ``stepscope watch`` can tell a killed process from a slow one. Alerts
(``alerts=`` or ``$STEPSCOPE_ALERTS``) and Prometheus metrics (``metrics_port=`` or
``$STEPSCOPE_METRICS_PORT``) are imported only when asked for: ``import stepscope`` runs in
every instrumented training process and must stay as light as the recorder.
"""

from __future__ import annotations

import importlib
import os
import socket
import warnings
from typing import Any

from ._live_env import ALERTS_ENV, METRICS_PORT_ENV

__all__ = ["start_live", "ALERTS_ENV", "METRICS_PORT_ENV"]



def _metrics_port(explicit: int | None) -> int | None:
    if explicit is not None:
        return int(explicit)
    value = os.environ.get(METRICS_PORT_ENV, "").strip()
    if not value:
        return None
    if not value.isdigit():
        warnings.warn(f"stepscope: {METRICS_PORT_ENV}={value!r} is not a port; metrics off",
                      RuntimeWarning, stacklevel=3)
        return None
    return int(value)


def start_live(rec: Any, alerts: str | os.PathLike[str] | None,
               metrics_port: int | None) -> Any:
    """Write the process record; start alerts and metrics if configured (else None)."""
    rec.run.append_event({"type": "process", "rank": rec.rank, "pid": os.getpid(),
                          "hostname": socket.gethostname()})
    port = _metrics_port(metrics_port)
    if alerts is None and port is None and not os.environ.get(ALERTS_ENV):
        return None
    monitor = importlib.import_module("stepscope.alerts.monitor")
    return monitor.start(rec, alerts, port, explicit_port=metrics_port is not None)
