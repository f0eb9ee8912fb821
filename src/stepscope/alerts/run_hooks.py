"""What ``stepscope run --alerts FILE --metrics-port PORT`` does around its training command.

The alert file is checked here, in the launcher, so a mistake is one line and exit 2
before training starts; the children get its absolute path in ``STEPSCOPE_ALERTS`` (the
secrets stay in the file or the environment: nothing secret is copied anywhere). When the
command has ended, however it ended (SIGKILL included), the launcher delivers the alerts
its processes recorded as pending and could not send (``flush_after_run``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..plugs import ALERTS_ENV, METRICS_PORT_ENV
from .config import load_alerts_config

__all__ = ["live_env", "flush_after_run"]

# How long the launcher, after its command ended, may spend delivering what is pending: the
# job is over, so a little more than one request timeout with a retry is affordable; a
# dead endpoint then leaves the alerts pending for `stepscope alerts flush RUN`.
FLUSH_AFTER_RUN_S = 15.0


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


def flush_after_run(run_dir: Path | None, alerts_file: str) -> None:
    """Deliver the run's pending alerts; one line per outcome on stderr; never raises."""
    if run_dir is None:
        return
    try:
        from ..rundir.store import RunDir
        from .pending import FlushNotRun, flush_pending

        results = flush_pending(RunDir(run_dir), load_alerts_config(alerts_file),
                                timeout_s=FLUSH_AFTER_RUN_S, observer="launcher")
    except FlushNotRun as exc:  # another flusher has them (a watch): left to it
        print(f"stepscope: {exc}", file=sys.stderr)
        return
    except Exception as exc:  # the command's exit status is what the caller waits for
        print(f"stepscope: pending alerts not delivered ({type(exc).__name__}); run "
              f"`stepscope alerts flush {run_dir}`", file=sys.stderr)
        return
    for r in results:
        print(f"stepscope: pending alert {r.rule} -> {r.sink}: {r.outcome}", file=sys.stderr)
