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

from .plug_env import ALERTS_ENV, METRICS_PORT_ENV, MLFLOW_ENV, TENSORBOARD_ENV

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


class _Handles:
    """The live parts a recorder closes: alerts/metrics, then the live export."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts

    def close(self, status: str = "finished") -> None:
        for part in self.parts:
            if hasattr(part, "on_records"):  # the live export ends its tracker runs
                part.close(status)
            else:
                part.close()


def start_live(rec: Any, alerts: str | os.PathLike[str] | None,
               metrics_port: int | None) -> _Handles | None:
    """Write the process record; start alerts, metrics and the live export (TensorBoard,
    MLflow) if configured (else None)."""
    rec.run.append_event({"type": "process", "rank": rec.rank, "pid": os.getpid(),
                          "hostname": socket.gethostname()})
    parts: list[Any] = []
    port = _metrics_port(metrics_port)
    if alerts is not None or port is not None or os.environ.get(ALERTS_ENV):
        monitor = importlib.import_module("stepscope.alerts.monitor")
        handle = monitor.start(rec, alerts, port, explicit_port=metrics_port is not None)
        if handle is not None:
            parts.append(handle)
    if os.environ.get(TENSORBOARD_ENV) or os.environ.get(MLFLOW_ENV):
        export = importlib.import_module("stepscope.report.live_export")
        live = export.start_from_env(rec)
        if live is not None:
            parts.append(live)
    return _Handles(parts) if parts else None
