"""Helpers shared by the `stepscope run` tests: launch a fixture script, parse its prints."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

SCRIPTS = Path(__file__).resolve().parent / "scripts"
BIN = Path(sys.executable).parent


def stepscope_run(out: Path, *command: str, args: tuple[str, ...] = (),
                  env: dict[str, str] | None = None, timeout: float = 120
                  ) -> subprocess.CompletedProcess[str]:
    """`stepscope run [args] --out OUT -- COMMAND...`, output captured."""
    full_env = dict(os.environ)
    full_env.pop("STEPSCOPE_RUN_DIR", None)
    full_env.update(env or {})
    cmd = [str(BIN / "stepscope"), "run", "--out", str(out), *args, "--", *command]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=full_env, check=False)


def python_script(name: str, *script_args: str) -> tuple[str, ...]:
    return (sys.executable, str(SCRIPTS / name), *script_args)


def printed_times(stdout: str, rank: int | None = None) -> dict[int, float]:
    """{step: perf_counter} from the script's own `[RANK r ]STEP i t` lines."""
    out: dict[int, float] = {}
    for m in re.finditer(r"^(?:RANK (\d+) )?STEP (\d+) ([0-9.]+)", stdout, re.M):
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
