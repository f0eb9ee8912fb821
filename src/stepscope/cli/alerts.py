"""``stepscope alerts test FILE`` and ``stepscope alerts flush RUN``.

``test``: one test message through every sink of an alert file; prints each sink's outcome
(never its URL or secret) and exits 0 only if every sink accepted the message, 1 otherwise.
``flush``: delivers the alerts a run recorded as pending (its process was killed, or its
endpoint was down when it exited); exits 0 when nothing is left pending, 1 otherwise; while
another flush of the same run is under way it says so in one line, sends nothing and exits
1. A bad file or run directory is one line and exit 2.
"""

from __future__ import annotations

import json
import sys

import click

from ..alerts import load_alerts_config, send_test_message
from ..rundir.store import RunDir
from . import cli


@cli.group("alerts")
def alerts_group() -> None:
    """Alerts: check an alert file against its chat robots, deliver a run's pending alerts."""


@alerts_group.command("test")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the outcomes as JSON.")
def alerts_test(file: str, as_json: bool) -> None:
    """Send one test message through every sink in FILE; exit 0 only if all accepted it."""
    config = load_alerts_config(file)
    if not config.sinks:
        click.echo(f"stepscope: {file} has no [[sink]] table: nothing to test", err=True)
        sys.exit(1)
    outcomes = send_test_message(config)
    ok = all(v.startswith("accepted") for v in outcomes.values())
    if as_json:
        click.echo(json.dumps({"ok": ok, "sinks": outcomes}))
    else:
        for name, outcome in outcomes.items():
            click.echo(f"{name}: {outcome}")
    sys.exit(0 if ok else 1)


@alerts_group.command("flush")
@click.argument("run", type=click.Path(file_okay=False))
@click.option("--alerts", "alerts_file", type=click.Path(dir_okay=False), default=None,
              help="Alert file whose sinks (by name) deliver them (default: the file each "
                   "pending alert names, as its process had it).")
@click.option("--json", "as_json", is_flag=True, help="Print the outcomes as JSON.")
def alerts_flush(run: str, alerts_file: str | None, as_json: bool) -> None:
    """Deliver the alerts RUN recorded as pending; exit 0 when none is left pending."""
    from ..alerts.pending import FlushNotRun, flush_pending

    config = load_alerts_config(alerts_file) if alerts_file else None
    try:
        results = flush_pending(RunDir.open(run), config)
    except FlushNotRun as exc:  # one flusher at a time: this one sent nothing
        click.echo(f"stepscope: {exc}", err=True)
        sys.exit(1)
    ok = all(r.outcome.startswith("accepted") for r in results)
    if as_json:
        click.echo(json.dumps({"ok": ok, "results": [r.to_dict() for r in results]}))
    elif not results:
        click.echo(f"{run}: no pending alerts")
    else:
        for r in results:
            click.echo(f"{r.rule} ({r.id}) -> {r.sink}: {r.outcome}")
    sys.exit(0 if ok else 1)
