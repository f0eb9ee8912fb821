"""``stepscope alerts test FILE``: one test message through every sink of an alert file.

Prints each sink's outcome (never its URL or secret) and exits 0 only if every sink
accepted the message, 1 otherwise; a bad file is one line and exit 2.
"""

from __future__ import annotations

import json
import sys

import click

from ..alerts import load_alerts_config, send_test_message
from . import cli


@cli.group("alerts")
def alerts_group() -> None:
    """Alert files: check one against its chat robots."""


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
