"""Helpers shared by the `stepscope run` tests: launch a fixture script, parse its prints."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
BIN = Path(sys.executable).parent


def stepscope_run(out: Path, *command: str, args: tuple[str, ...] = (),
                  env: dict[str, str] | None = None, timeout: float = 120,
                  cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`stepscope run [args] --out OUT -- COMMAND...`, output captured."""
    full_env = dict(os.environ)
    full_env.pop("STEPSCOPE_RUN_DIR", None)
    full_env.update(env or {})
    cmd = [str(BIN / "stepscope"), "run", "--out", str(out), *args, "--", *command]
    # A session of its own, so that a timeout can end torchrun's workers too.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, start_new_session=True, cwd=cwd)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, stdout, stderr)


# A given peak for the runs whose MFU a test checks, where stepscope's CPU table has no
# figure for this host (its microarchitecture's FMA units are not in it, e.g. a VM that
# reports a model number that contradicts its features): the MFU is then checked against
# the given peak. Where the table has one, nothing is given and the auto-detected peak
# is the one checked.
GIVEN_PEAK_TFLOPS = "0.5"


def host_peak_known() -> bool:
    from stepscope.record.host import cpu_peak_here

    return cpu_peak_here("fp32")[0] is not None


def peak_args() -> tuple[str, ...]:
    """`stepscope run` options for an MFU on any host (see GIVEN_PEAK_TFLOPS)."""
    return () if host_peak_known() else ("--peak-tflops", GIVEN_PEAK_TFLOPS)


def peak_env() -> dict[str, str]:
    """The same for a script recording through a callback (not under `stepscope run`)."""
    from stepscope.calc.hardware import PEAK_ENV

    return {} if host_peak_known() else {PEAK_ENV: GIVEN_PEAK_TFLOPS}


def python_script(name: str, *script_args: str) -> tuple[str, ...]:
    return (sys.executable, str(SCRIPTS / name), *script_args)


def printed_times(stdout: str, rank: int | None = None) -> dict[int, float]:
    """{step: perf_counter} from the script's own `[RANK r ]STEP i t` lines."""
    out: dict[int, float] = {}
    # Not anchored at line starts: torchrun runs workers unbuffered (python -u), so one
    # rank's line can be split by another's; timestamps have exactly 6 decimals.
    for m in re.finditer(r"(?:RANK (\d+) )?STEP (\d+) (\d+\.\d{6})", stdout):
        if rank is not None and int(m.group(1) or 0) != rank:
            continue
        out[int(m.group(2))] = float(m.group(3))
    return out


def interval_errors(recorded: np.ndarray, steps: np.ndarray, printed: dict[int, float]
                    ) -> np.ndarray:
    """Relative difference between recorded step times and the script's own intervals."""
    errs = []
    for s, t in zip(steps.tolist(), recorded.tolist(), strict=False):
        if s - 1 in printed and s in printed:
            own = printed[s] - printed[s - 1]
            errs.append(abs(t - own) / own)
    return np.array(errs)


def assert_times_agree(recorded: np.ndarray, steps: np.ndarray, printed: dict[int, float],
                       tol: float = 0.05) -> None:
    """Recorded step times agree with the script's own timestamps within ``tol``.

    Judged on every window of two consecutive steps and on the whole run, from step 3.
    Why windows: the script prints its timestamp a little after the optimizer hook, and
    on this shared 2-core machine that gap varies by a millisecond or more; a late print
    lengthens one printed interval and shortens the next by as much (measured: +-1 ms
    alternating on 50 ms DDP steps), an error of the reference, not of the recording. A
    two-step window cancels it; a real disagreement (time missing from or added to a
    step) does not cancel. Steps 1-2 overlap the other test worker's start-up.
    """
    assert len(interval_errors(recorded, steps, printed)) == len(steps) - 1
    rec = {int(s): float(t) for s, t in zip(steps.tolist(), recorded.tolist(), strict=True)}
    errs = []
    for s in sorted(rec):
        if s >= 4 and s - 2 in printed and s in printed:
            own = printed[s] - printed[s - 2]
            errs.append(abs(rec[s] + rec[s - 1] - own) / own)
    assert errs and max(errs) < tol, errs
    first, last = 3, max(rec)
    own_total = printed[last] - printed[first - 1]
    rec_total = sum(rec[s] for s in range(first, last + 1))
    assert abs(rec_total - own_total) / own_total < tol, (rec_total, own_total)
