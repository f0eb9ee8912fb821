"""The environment variables that switch on the live half in any entry point (plain names,
so the light ``_live`` and the alert modules it loads on demand share them without either
importing the other)."""

__all__ = ["ALERTS_ENV", "METRICS_PORT_ENV"]

ALERTS_ENV = "STEPSCOPE_ALERTS"  # an alert file (TOML) for every Recorder of the process
METRICS_PORT_ENV = "STEPSCOPE_METRICS_PORT"  # Prometheus /metrics on this port + local rank
