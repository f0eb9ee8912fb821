"""The environment variables that switch on the live half in any entry point (plain names,
so the light ``_live`` and the alert modules it loads on demand share them without either
importing the other)."""

__all__ = ["ALERTS_ENV", "METRICS_PORT_ENV", "TENSORBOARD_ENV", "MLFLOW_ENV",
           "MLFLOW_EXPERIMENT_ENV"]

ALERTS_ENV = "STEPSCOPE_ALERTS"  # an alert file (TOML) for every Recorder of the process
METRICS_PORT_ENV = "STEPSCOPE_METRICS_PORT"  # Prometheus /metrics on this port + local rank
# `stepscope run --tensorboard DIR --mlflow URI`: live export from every Recorder's writer
# thread (report/live_export.py).
TENSORBOARD_ENV = "STEPSCOPE_TENSORBOARD"
MLFLOW_ENV = "STEPSCOPE_MLFLOW"
MLFLOW_EXPERIMENT_ENV = "STEPSCOPE_MLFLOW_EXPERIMENT"
