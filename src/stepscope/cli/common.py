"""What every command shares: the one JSON emitter, and the note on unreadable events.

``emit_json`` writes every ``--json`` document (indented, numpy scalars and arrays as
numbers, anything else as its ``str``). Runs are read through ``stepscope.rundir.run.Run``.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import orjson

from ..rundir.store import EVENTS_JSONL

if TYPE_CHECKING:
    from ..rundir.run import Run

__all__ = ["emit_json", "note_event_problems"]


def emit_json(obj: Any, *, one_line: bool = False) -> None:
    """Print ``obj`` as the command's ``--json`` document on stdout.

    ``one_line``: no indentation, for commands whose stdout also carries another program's
    output (``stepscope run``: the outcome is the last line after the training script's).
    """
    option = orjson.OPT_SERIALIZE_NUMPY | (0 if one_line else orjson.OPT_INDENT_2)
    sys.stdout.flush()  # whatever click.echo or print wrote first stays first
    sys.stdout.buffer.write(orjson.dumps(obj, option=option, default=str) + b"\n")
    sys.stdout.flush()


def note_event_problems(run: Run) -> None:
    """One stderr line when the run's events.jsonl had records that could not be read."""
    run.events()
    stats = run.event_stats
    if stats is not None and stats.skipped:
        first = f"; first: {stats.problems[0]}" if stats.problems else ""
        sys.stderr.write(f"stepscope: note: {stats.skipped} corrupt record(s) in "
                         f"{EVENTS_JSONL} skipped{first}\n")
