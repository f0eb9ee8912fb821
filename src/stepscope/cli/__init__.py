"""Command-line entry point: parses arguments and wires the layers; nothing else.

Each area registers its commands from its own module (``cli/<area>.py``) so the command
surface stays one click group while the wiring code stays small per concept.
Every command that reports has ``--json``. User mistakes print one line and exit 2.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from .. import __version__
from ..errors import StepscopeError

__all__ = ["main", "cli"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="stepscope")
def cli() -> None:
    """stepscope: the training run's health-check sheet, then the bottleneck."""


def _register() -> None:
    # Imported for their side effect of adding commands to `cli`.
    from . import calc, compare, demo, diagnose, export, report, run, serve, trace  # noqa: F401


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI; exits with the command's status (2 on a usage or input error)."""
    _register()
    try:
        rv = cli.main(args=list(argv) if argv is not None else None,
                      prog_name="stepscope", standalone_mode=False)
    except StepscopeError as exc:
        click.echo(f"stepscope: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("stepscope: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        hint = " (see --help)" if isinstance(exc, click.UsageError) else ""
        click.echo(f"stepscope: error: {exc.format_message()}{hint}", err=True)
        sys.exit(exc.exit_code)
    except BrokenPipeError:
        sys.exit(0)
    sys.exit(rv if isinstance(rv, int) else 0)
