"""What every command shares: the one JSON emitter and the one run loader.

``emit_json`` writes every ``--json`` document (indented, numpy scalars and arrays as
numbers, anything else as its ``str``). ``load_steps`` opens a run directory and reads its
step records, with one message when a command needs steps and the run has none.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..errors import StepscopeError
from ..rundir.store import EVENTS_JSONL, STEPS_DIR, ReadStats, RunDir
from ..schema import RunMeta, StepTable

__all__ = ["emit_json", "RunSteps", "load_steps", "PendingSteps", "no_records_error",
           "note_event_problems"]


def emit_json(obj: Any, *, one_line: bool = False) -> None:
    """Print ``obj`` as the command's ``--json`` document on stdout.

    ``one_line``: no indentation, for commands whose stdout also carries another program's
    output (``stepscope run``: the outcome is the last line after the training script's).
    """
    option = orjson.OPT_SERIALIZE_NUMPY | (0 if one_line else orjson.OPT_INDENT_2)
    sys.stdout.flush()  # whatever click.echo or print wrote first stays first
    sys.stdout.buffer.write(orjson.dumps(obj, option=option, default=str) + b"\n")
    sys.stdout.flush()


@dataclass
class RunSteps:
    """A run directory opened and read: handle, run.json, step table, what was skipped."""

    run: RunDir
    meta: RunMeta
    table: StepTable
    stats: ReadStats


def load_steps(path: str | Path, *, require: bool = True) -> RunSteps:
    """Open and read a run; raises StepscopeError on bad input, or (``require``) no steps.

    Example::

        loaded = load_steps("runs/exp1")
        loaded.table["step_time_s"]
    """
    return PendingSteps(path, require=require).result()


class PendingSteps:
    """``load_steps``, started: the run is opened (bad input raises here) and its rank
    files decode in worker processes while the caller goes on; ``result()`` waits. Use it
    in a ``with`` block, or call ``result()``: the workers end with it.

    Example::

        with PendingSteps("runs/b") as pending:
            ...                                  # work on run A meanwhile
            loaded_b = pending.result()
    """

    def __init__(self, path: str | Path, *, require: bool = True) -> None:
        self.run = RunDir.open(path)
        self.meta = self.run.read_meta()
        self._require = require
        self._read = self.run.start_read_steps()

    def __enter__(self) -> PendingSteps:
        return self

    def __exit__(self, *exc: object) -> None:
        self._read.close()

    def result(self) -> RunSteps:
        table, stats = self._read.result()
        if self._require and not len(table):
            raise no_records_error(self.run, stats)
        return RunSteps(self.run, self.meta, table, stats)


def no_records_error(run: RunDir, stats: ReadStats) -> StepscopeError:
    """Why a run has no readable step records, as the one-line error the CLI prints."""
    steps = run.path / STEPS_DIR
    try:
        os.listdir(steps)
    except FileNotFoundError:
        return StepscopeError(f"{run.path} has no {STEPS_DIR}/ directory: no step was "
                              "recorded; record steps with stepscope.Recorder or run the "
                              "training script under `stepscope run`")
    except OSError as exc:
        return StepscopeError(f"cannot read {steps}: {exc.strerror}; give this user read "
                              "access to the run directory")
    if stats.skipped:
        return StepscopeError(f"{run.path} has no readable step records: {stats.skipped} "
                              f"unreadable record(s) in {stats.files} file(s), first: "
                              f"{stats.problems[0] if stats.problems else '?'}")
    # the instrumentation's own account of why, when it left one in events.jsonl
    why = [str(e["message"]) for e in run.read_events(type="finding")[0]
           if str(e.get("message", "")).startswith("no steps recorded")]
    return StepscopeError(
        f"{run.path} has no step records ({stats.files} step file(s)); " + (why[0] if why
        else "record steps with stepscope.Recorder or run the training script under "
        "`stepscope run` (it must call optimizer.step())"))


def note_event_problems(stats: ReadStats) -> None:
    """One stderr line when events.jsonl had records that could not be read."""
    if stats.skipped:
        first = f"; first: {stats.problems[0]}" if stats.problems else ""
        sys.stderr.write(f"stepscope: note: {stats.skipped} corrupt record(s) in "
                         f"{EVENTS_JSONL} skipped{first}\n")
