"""What ``stepscope run --alerts FILE --metrics-port PORT`` hands its training command.

The alert file is checked here, in the launcher, so a mistake is one line and exit 2
before training starts; the children get its absolute path in ``STEPSCOPE_ALERTS`` (the
secrets stay in the file or the environment: nothing secret is copied anywhere).
"""

from __future__ import annotations

import os
from pathlib import Path

from .._live_env import ALERTS_ENV, METRICS_PORT_ENV
from .config import load_alerts_config

__all__ = ["live_env"]


def live_env(alerts_file: str | None, metrics_port: int | None) -> dict[str, str]:
    """Environment for the children; raises ``AlertConfigError`` on a bad alert file."""
    env: dict[str, str] = {}
    path = alerts_file or os.environ.get(ALERTS_ENV) or None
    if path:
        load_alerts_config(path)
        env[ALERTS_ENV] = str(Path(path).resolve())
    if metrics_port is not None:
        env[METRICS_PORT_ENV] = str(metrics_port)
    return env
