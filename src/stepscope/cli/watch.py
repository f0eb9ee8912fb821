"""``stepscope watch PATH [--alerts FILE] [--stall-after S]``: follow runs from outside.

One line per alert on stdout (``--json``: one JSON object per line); the alert file's
sinks get them too. Exits when the run ends: 0 if it finished, 1 if it failed or its
processes are gone; on a root of runs it keeps watching until interrupted.
"""

from __future__ import annotations

import json
import os
import sys

import click

from ..alerts.config import AlertsConfig, load_alerts_config
from ..alerts.model import Alert
from ..alerts.watch import watch_path
from . import cli


@cli.command("watch")
@click.argument("path", type=click.Path())
@click.option("--alerts", "alerts_file", type=click.Path(dir_okay=False), default=None,
              help="Alert file (TOML) with [rules] and [[sink]] tables "
                   "(default: $STEPSCOPE_ALERTS, else print only).")
@click.option("--stall-after", "stall_after_s", type=float, default=None, metavar="S",
              help="Report a rank that made no step for S seconds (default: the alert "
                   "file's stall_after_s, else 10x the steady median, at least 300 s).")
@click.option("--poll", "poll_s", type=float, default=1.0, show_default=True,
              help="Seconds between looks at the step files.")
@click.option("--json", "as_json", is_flag=True, help="Print each alert as a JSON line.")
def watch_cmd(path: str, alerts_file: str | None, stall_after_s: float | None, poll_s: float,
              as_json: bool) -> None:
    """Follow the run (or every run under a root) at PATH and report what goes wrong, a
    frozen or killed trainer included."""
    alerts_file = alerts_file or os.environ.get("STEPSCOPE_ALERTS") or None
    config = load_alerts_config(alerts_file) if alerts_file else AlertsConfig()
    limit = stall_after_s if stall_after_s is not None else config.rules.stall_after_s

    def emit(alert: Alert) -> None:
        line = json.dumps(alert.to_dict()) if as_json else alert.headline()
        click.echo(line)
        sys.stdout.flush()

    try:
        code = watch_path(path, config, limit, emit, poll_s=max(0.05, poll_s))
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
