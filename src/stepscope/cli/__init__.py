"""Command-line entry point: parses arguments and wires the layers; nothing else.

Each area registers its commands from its own module (``cli/<area>.py``) so the command
surface stays one click group while the wiring code stays small per concept.
Every command that reports has ``--json``. User mistakes print one line and exit 2.

Start-up: the group is lazy (click's lazy-loading group pattern). ``stepscope --help``
lists the commands from the table below without importing their modules, and a command's
module is imported only when that command runs, so no command pays for another's imports
(numpy, rich, the analyses, torch). Function-local imports in ``cli/`` exist for the same
reason: start-up time, never to dodge an import cycle (tests/core/test_house.py checks).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

import click

from ..errors import StepscopeError
from ..proc.alloc import tune_for_bulk
from ..version import __version__

__all__ = ["main", "cli", "COMMANDS", "BULK_COMMANDS"]

# command -> (module under stepscope.cli that registers it, its line in `stepscope --help`).
# The line is the first paragraph of the command's docstring; tests/core/test_public_surface.py
# checks that the two agree.
COMMANDS: dict[str, tuple[str, str]] = {
    "alerts": ("alerts", "Alerts: check an alert file against its chat robots, deliver a "
               "run's pending alerts."),
    "compare": ("compare", "Compare RUN_B against the baseline RUN_A: one variable, two "
                           "ledgers, one verdict."),
    "demo": ("demo", "Train a tiny GPT on the CPU, measure everything, print the "
                     "health-check sheet."),
    "diagnose": ("diagnose", "Ranked findings, the bottleneck and the next experiment for "
                             "run directory RUN."),
    "eval-log": ("compare", "Record evaluation results into RUN (read by compare's quality "
                            "ledger)."),
    "export": ("export", "Write RUN's records to TensorBoard, MLflow, CSV or Parquet."),
    "index": ("compare", "Index every run under ROOT (incremental); list, filter, sort, find "
                         "the best."),
    "isolate": ("diagnose", "Prove a suspect: run COMMAND as is and with the data pipeline "
                            "(data) or gradient sync (comm) removed, then compare "
                            "throughput."),
    "memory": ("calc_memory", "Training memory per device: weights, grads, optimizer states, "
                       "activations."),
    "mfu": ("calc", "FLOPs per token of a model; with a throughput and a peak, MFU and HFU."),
    "plan": ("calc_plan", "Parallel layouts that fit, fastest first by an estimated step "
                          "time."),
    "report": ("report", "Print the health-check sheet of RUN (a run directory)."),
    "run": ("run", "Run COMMAND (after `--`) with per-step recording of every rank."),
    "serve": ("serve", "Serve the dashboard of every run under ROOT until Ctrl-C."),
    "scaling": ("compare", "Throughput per device and scaling efficiency of runs that differ "
                           "in device count."),
    "watch": ("watch", "Follow the run (or every run under a root) at PATH and report what "
                       "goes wrong, a frozen or killed trainer included."),
    "trace": ("trace", "Break profiler traces down: per-step phases, idle/compute/comm "
                       "overlap, top ops."),
}

# One-shot commands that read whole runs into columns: their process's allocator keeps freed
# blocks for reuse (stepscope.proc.alloc). Not the long-running ones (serve, watch) and not
# `run`, which hosts the training process.
BULK_COMMANDS = frozenset({"report", "diagnose", "compare", "index", "scaling", "trace",
                           "export"})


class _LazyGroup(click.Group):
    """Commands known by name; each one's module is imported when it is first asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(set(COMMANDS) | set(self.commands))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(f"{__name__}.{COMMANDS[cmd_name][0]}")
        if cmd_name in BULK_COMMANDS:
            tune_for_bulk()
        return super().get_command(ctx, cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        names = self.list_commands(ctx)
        limit = formatter.width - 6 - max(map(len, names))
        rows = []
        for name in names:
            # a not yet imported command is shortened by click's own rule, as a loaded one is
            cmd = self.commands.get(name) or click.Command(name, help=COMMANDS[name][1])
            rows.append((name, cmd.get_short_help_str(limit)))
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="stepscope")
def cli() -> None:
    """stepscope: the training run's health-check sheet, then the bottleneck."""


def _register() -> None:
    """Import every command module (tests and tools that walk the whole surface)."""
    for module in sorted({m for m, _ in COMMANDS.values()}):
        importlib.import_module(f"{__name__}.{module}")


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI; exits with the command's status (2 on a usage or input error)."""
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
