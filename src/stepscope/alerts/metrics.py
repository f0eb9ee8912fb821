"""Prometheus metrics per rank (opt-in): ``/metrics`` on ``port + local rank``.

Built on the ``prometheus-client`` library (extra ``alerts``). The gauges are updated by a
recorder listener, so on the writer thread after each batch of step records; the HTTP
server is the library's own daemon thread. Labels: ``run`` and ``rank``.

Metrics: ``stepscope_step_time_seconds``, ``stepscope_tokens_per_second``, ``stepscope_mfu``
(when run.json has ``flops_per_token`` and ``peak_flops_per_device``),
``stepscope_data_wait_share``, ``stepscope_exposed_comm_share``, ``stepscope_loss``,
``stepscope_grad_norm``, ``stepscope_mem_peak_bytes``, ``stepscope_steps_total`` and
``stepscope_alerts_total`` (by rule).

Example::

    exporter = MetricsExporter(9400, run_name="exp1", rank=0, local_rank=0)
    rec.add_listener(exporter.on_records)
"""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

from ..errors import ConfigError
from .model import Alert
from .rules import record_value

__all__ = ["MetricsExporter", "ADDR_ENV", "flops_from_meta"]

# Bind address: 127.0.0.1 by default (the numbers, run name included, are nobody else's
# business: a scraper on another host is asked for with STEPSCOPE_METRICS_ADDR=0.0.0.0).
# Where it listens is printed on stderr either way.
ADDR_ENV = "STEPSCOPE_METRICS_ADDR"
DEFAULT_ADDR = "127.0.0.1"
_GAUGES = {
    "step_time_seconds": "Host wall time of the last step, seconds",
    "tokens_per_second": "Tokens per second of this rank over the last step",
    "mfu": "Model FLOPs utilisation of this rank's device over the last step (0..1)",
    "data_wait_share": "Share of the last step spent waiting for data (0..1)",
    "exposed_comm_share": "Share of the last step in communication not overlapped (0..1)",
    "loss": "Training loss of the last step",
    "grad_norm": "Gradient norm of the last step",
    "mem_peak_bytes": "Peak device memory of the last step, bytes",
}
# run.json's FLOPs facts are looked up this often until found (rank 0 may write later).
_META_RETRY_S = 30.0


class MetricsExporter:
    """One rank's gauges and their HTTP endpoint."""

    def __init__(self, port: int, run_name: str, rank: int, local_rank: int = 0,
                 flops: Callable[[], tuple[float, float] | None] | None = None) -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            raise ConfigError("--metrics-port needs prometheus-client: "
                              "pip install 'stepscope[alerts]'") from None
        self._prom = prom
        self.registry = prom.CollectorRegistry()
        labels = ["run", "rank"]
        self._labels = {"run": run_name, "rank": str(rank)}
        self._g = {name: prom.Gauge(f"stepscope_{name}", doc, labels, registry=self.registry)
                   for name, doc in _GAUGES.items()}
        self._steps = prom.Counter("stepscope_steps", "Steps recorded", labels,
                                   registry=self.registry)
        self._alerts = prom.Counter("stepscope_alerts", "Alerts fired, by rule",
                                    [*labels, "rule"], registry=self.registry)
        self._flops_of = flops
        self._flops: tuple[float, float] | None = None
        self._flops_checked = -math.inf
        self.port = port + local_rank
        addr = os.environ.get(ADDR_ENV) or DEFAULT_ADDR
        try:
            self._server, self._thread = prom.start_http_server(self.port, addr=addr,
                                                                registry=self.registry)
        except OSError as exc:
            raise ConfigError(f"metrics port {self.port} on {addr}: {exc.strerror or exc}; "
                              "choose another --metrics-port") from None
        shown = f"[{addr}]" if ":" in addr else addr
        sys.stderr.write(f"stepscope: Prometheus metrics of rank {local_rank} at "
                         f"http://{shown}:{self.port}/metrics"
                         + (f" ({ADDR_ENV}=0.0.0.0 to serve other hosts)\n"
                            if addr == DEFAULT_ADDR else "\n"))

    def _set(self, name: str, value: float | None) -> None:
        if value is not None and math.isfinite(value):
            self._g[name].labels(**self._labels).set(value)

    def _fpt_peak(self) -> tuple[float, float] | None:
        if self._flops is None and self._flops_of is not None:
            now = time.monotonic()
            if now - self._flops_checked >= _META_RETRY_S:
                self._flops_checked = now
                self._flops = self._flops_of()
        return self._flops

    def on_records(self, records: list[dict[str, Any]]) -> None:
        """Recorder listener: the last full step's numbers become the gauges."""
        for rec in records:
            st = record_value(rec, "step_time_s")
            for name, key in (("loss", "loss"), ("grad_norm", "grad_norm"),
                              ("mem_peak_bytes", "mem_peak_bytes")):
                self._set(name, record_value(rec, key))
            if st is None or not math.isfinite(st) or st <= 0:
                continue  # a value logged late: no timing in it
            self._steps.labels(**self._labels).inc()
            self._set("step_time_seconds", st)
            tokens = record_value(rec, "tokens")
            if tokens is not None and tokens > 0:
                self._set("tokens_per_second", tokens / st)
                fp = self._fpt_peak()
                if fp is not None:
                    self._set("mfu", tokens / st * fp[0] / fp[1])
            for name, key in (("data_wait_share", "data_wait_s"),
                              ("exposed_comm_share", "comm_exposed_s")):
                v = record_value(rec, key)
                self._set(name, v / st if v is not None else None)

    def on_alert(self, alert: Alert) -> None:
        self._alerts.labels(**self._labels, rule=alert.rule).inc()

    def close(self, status: str = "finished") -> None:
        """Stop serving (``status``, the plug protocol's, changes nothing here)."""
        self._server.shutdown()
        self._server.server_close()


def flops_from_meta(meta_env: Mapping[str, Any]) -> tuple[float, float] | None:
    """(FLOPs per token, peak FLOP/s per device) from run.json's environment, if both."""
    fpt, peak = meta_env.get("flops_per_token"), meta_env.get("peak_flops_per_device")
    if isinstance(fpt, (int, float)) and isinstance(peak, (int, float)) and fpt and peak:
        return float(fpt), float(peak)
    return None
