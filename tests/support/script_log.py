"""The third-party suite's side of its scripts: parse their own numbers, run them, read back.

Each script in tests/thirdparty/scripts/ prints what it measured itself as lines
``SS <kind> key=value ...`` (values are Python literals, floats written with ``repr`` so they
round-trip exactly). :func:`printed` turns a captured stdout into ``{kind: [record, ...]}``;
:func:`run_under_stepscope` runs a script under ``stepscope run`` and returns the script's
records next to what stepscope wrote (step table, report JSON with findings).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepscope.rundir.store import RunDir
from stepscope.schema import StepTable
from support.torch_run import BIN, stepscope_run

THIRDPARTY_SCRIPTS = Path(__file__).resolve().parents[1] / "thirdparty" / "scripts"
_LINE = re.compile(r"^SS (\w+)(.*)$", re.MULTILINE)
# a value runs to the next " key=" (list reprs hold spaces, never "word=")
_PAIR = re.compile(r" (\w+)=(.*?)(?= \w+=|$)")


def printed(stdout: str) -> dict[str, list[dict[str, Any]]]:
    """``{kind: [{key: value}, ...]}`` from the script's ``SS`` lines, in print order."""
    out: dict[str, list[dict[str, Any]]] = {}
    for m in _LINE.finditer(stdout):
        rec = {k: ast.literal_eval(v) for k, v in _PAIR.findall(m.group(2))}
        out.setdefault(m.group(1), []).append(rec)
    return out


@dataclass
class ScriptRun:
    """One script run under ``stepscope run``: its own numbers and stepscope's records."""

    proc: subprocess.CompletedProcess[str]
    own: dict[str, list[dict[str, Any]]]
    out: Path
    table: StepTable
    report: dict[str, Any]

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self.own.get("step", [])

    def column(self, name: str) -> list[float]:
        return self.table[name].tolist() if name in self.table.columns else []

    def report_meta_environment(self) -> dict[str, Any]:
        """run.json's environment (FLOPs fields, peak FLOP/s and their sources)."""
        env: dict[str, Any] = RunDir(self.out).read_meta().environment
        return env

    def report_meta_baseline(self) -> dict[str, Any]:
        """run.json's baseline fingerprint (batch layout, parameter count, ...)."""
        b: dict[str, Any] = RunDir(self.out).read_meta().baseline
        return b

    def evals(self) -> list[tuple[int, dict[str, float]]]:
        """The run's eval events (compare's quality ledger reads them): (step, metrics)."""
        events = RunDir(self.out).read_events("eval")[0]
        return [(e["step"], e["metrics"]) for e in events]

    def findings(self, *severities: str) -> list[str]:
        """Messages of the report's findings with one of ``severities``."""
        return [f["message"] for f in self.report.get("findings", [])
                if f["severity"] in severities]


def run_under_stepscope(out: Path, script: str, *script_args: str, cwd: Path | None = None,
                        args: tuple[str, ...] = (), timeout: float = 240) -> ScriptRun:
    """``stepscope run --out OUT -- python SCRIPT ARGS`` and read everything back."""
    command = (sys.executable, str(THIRDPARTY_SCRIPTS / script), *script_args)
    proc = stepscope_run(out, *command, args=args, timeout=timeout, cwd=cwd)
    table = RunDir(out).read_steps()[0] if (out / "steps").is_dir() else StepTable.empty()
    return ScriptRun(proc, printed(proc.stdout), out, table, report_json(out))


def assert_no_warning(run: ScriptRun, again: Callable[[], ScriptRun]) -> None:
    """No warning or critical finding in ``run``. A gap of a second or two on this shared
    host can be a neighbour's doing that the process's CPU accounting does not show
    (a CI run met one between steps 0 and 1 of an 80 ms-a-step run); when stall findings
    are the only ones, the script runs once more (``again``) and that run must be clean.
    A stall stepscope itself causes would be in both."""
    bad = [f for f in run.report.get("findings", []) if f["severity"] in ("warning", "critical")]
    if bad and all(f["category"] == "stall" for f in bad):
        second = again()
        assert second.findings("warning", "critical") == [], ([f["evidence"] for f in bad],
                                                              second.report["findings"])
        return
    assert [f["message"] for f in bad] == []


def report_json(out: Path, *args: str) -> dict[str, Any]:
    """``stepscope report RUN --json [ARGS]`` parsed; {} when the run has no report."""
    proc = subprocess.run([str(BIN / "stepscope"), "report", str(out), "--json", *args],
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip()}
    parsed: dict[str, Any] = json.loads(proc.stdout)
    return parsed


def assert_between_steps_apart(run: ScriptRun, between: dict[int, float],
                               columns: tuple[str, ...]) -> None:
    """Time the script spent between steps (``{step after it: seconds}``, its own clock) is
    not in that step's ``step_time_s`` and is in the sum of ``columns`` instead.

    The step's own interval (script timestamps after each optimizer step) holds the
    between-steps work plus the training; a recording that books the work apart has a
    step time shorter than the interval by most of it (0.8: the script's timestamps sit a
    little after stepscope's boundary; the work itself is hundreds of milliseconds).
    """
    steps = run.column("step")
    step_time = dict(zip(steps, run.column("step_time_s"), strict=True))
    own_t = {s["step"]: s["t"] for s in run.steps}
    for k, seconds in between.items():
        own_interval = own_t[k] - own_t[k - 1]
        assert step_time[k] < own_interval - 0.8 * seconds, (k, step_time[k], seconds)
    booked = {k: 0.0 for k in between}
    for col in columns:
        assert col in run.table.columns, (col, run.table.columns)
        for k, v in zip(steps, run.column(col), strict=True):
            if k in booked and v == v:  # NaN: nothing booked on that step
                booked[k] += v
    # 10 ms either side as well: on a loaded host the process can lose a scheduler slice
    # between the script's timestamps and stepscope's boundaries (CI: an L-BFGS prediction
    # of 16.1 ms by the script's clock was booked as 11.7 ms, all three tries).
    for k, seconds in between.items():
        assert 0.8 * seconds - 0.01 < booked[k] < 1.2 * seconds + 0.01, (k, booked[k], seconds)
