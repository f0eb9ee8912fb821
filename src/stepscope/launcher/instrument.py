"""Launch a training command with zero-code instrumentation (what ``stepscope run`` does).

The child gets a temporary directory on ``PYTHONPATH`` holding a ``sitecustomize.py`` that
calls :func:`stepscope.integrations.torch.auto.bootstrap` and
:func:`stepscope.integrations.ms_boot.bootstrap` (each waits for its framework's import;
then it chains to any other ``sitecustomize`` on the path), plus ``STEPSCOPE_*``
variables naming the run directory and the switches. This works through launchers:
``torchrun`` and ``msrun`` pass their environment to every worker, so each rank
instruments itself and writes its own ``steps/rank-N.jsonl``.

After the command exits, run.json gets its final status: a crash already recorded by the
child (exception type and message) is kept; otherwise a non-zero exit marks the run
failed with the exit code or signal, or with the first rank's crash from events.jsonl.
The launcher analyses nothing: ``stepscope run`` analyses a captured profile after it
returns (``LaunchOutcome.profile_dir``).

Example::

    from stepscope.launcher.instrument import launch
    outcome = launch(["python", "train.py"], out="runs/exp1", profile_steps="5:7")
    outcome.returncode, outcome.status        # 0, "finished"

Isolation experiments pass extra variables, e.g. ``env={"STEPSCOPE_REPLAY_DATA": "1"}``.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ConfigError, RunDirError
from ..integrations.torch.settings import parse_steps
from ..rundir.store import RunDir, utc_stamp
from ..schema import RunMeta
from .supervise import DEFAULT_GRACE_S, run_child

__all__ = ["launch", "LaunchOutcome", "SITECUSTOMIZE", "NOT_ATTACHED_EXIT"]

# Exit status of `stepscope run` when the command succeeded but nothing could be attached
# to (a MindSpore script without any step boundary stepscope knows): 3, apart from the
# usage errors' 2.
NOT_ATTACHED_EXIT = 3

SITECUSTOMIZE = '''\
# Written by `stepscope run`: instruments this Python process, then hands over to any
# other sitecustomize further down sys.path (so a site's own customisation still runs).
import importlib.machinery as _m
import importlib.util as _u
import os as _os
import sys as _sys

try:
    from stepscope.integrations.torch import auto as _ss

    _ss.bootstrap()
except Exception as _exc:  # never stop the training script from starting
    _sys.stderr.write(f"stepscope: instrumentation disabled: {_exc!r}\\n")
try:
    from stepscope.integrations import ms_boot as _ms

    _ms.bootstrap()
except Exception as _exc:
    _sys.stderr.write(f"stepscope: MindSpore instrumentation disabled: {_exc!r}\\n")

_here = _os.path.dirname(_os.path.abspath(__file__))
_rest = [p for p in _sys.path if _os.path.abspath(p or ".") != _here]
_spec = _m.PathFinder.find_spec("sitecustomize", _rest)
if _spec is not None and _spec.loader is not None:
    _mod = _u.module_from_spec(_spec)
    _spec.loader.exec_module(_mod)
'''


@dataclass
class LaunchOutcome:
    """Result of :func:`launch`: where the run is and how the command ended."""

    run_dir: Path
    returncode: int
    status: str
    error: str | None
    profile_dir: Path | None = None
    profile_analysis: dict[str, Any] = field(default_factory=dict)  # filled by the CLI

    def to_dict(self) -> dict[str, Any]:
        return {"run_dir": str(self.run_dir), "returncode": self.returncode,
                "status": self.status, "error": self.error,
                "profile_dir": str(self.profile_dir) if self.profile_dir else None,
                "profile_analysis": self.profile_analysis}


def default_out(name: str = "") -> Path:
    return Path("runs") / f"{name or 'run'}-{utc_stamp()}"


def launch(command: Sequence[str], out: str | os.PathLike[str] | None = None, *,
           name: str = "", profile_steps: str | None = None,
           env: Mapping[str, str] | None = None,
           grace_s: float = DEFAULT_GRACE_S) -> LaunchOutcome:
    """Run ``command`` instrumented; return when it exits (see the module docstring).

    ``out`` must not hold a run already (:meth:`RunDir.create_new`); signals are forwarded
    to the command, which gets ``grace_s`` seconds to exit (:mod:`stepscope.launcher.supervise`).
    """
    if not command:
        raise ConfigError("no command given: expected `stepscope run -- python train.py ...`")
    if profile_steps:
        try:
            parse_steps(profile_steps)
        except ValueError as exc:
            raise ConfigError(f"--profile-steps: {exc}; e.g. --profile-steps 5:8") from exc
    if shutil.which(command[0]) is None and not Path(command[0]).is_file():
        raise ConfigError(f"command {command[0]!r} not found on PATH; pass the program to "
                          "run after `--`, e.g. `stepscope run -- python train.py`")
    path = Path(out) if out else default_out(name)
    meta = RunMeta(run_id=path.name, name=name or path.name, created_utc=utc_stamp(),
                   command=list(command),
                   config={"launcher": "stepscope run", "profile_steps": profile_steps})
    run = RunDir.create_new(path, meta)  # never overwrites an earlier run
    prof_dir = run.new_profile_dir() if profile_steps else None
    boot = Path(tempfile.mkdtemp(prefix="stepscope-boot-"))  # not in the run directory
    try:
        (boot / "sitecustomize.py").write_text(SITECUSTOMIZE)
        child_env = _child_env(boot, run.path, name, profile_steps, prof_dir, env)
        rc = _run(list(command), child_env, grace_s)
    finally:
        shutil.rmtree(boot, ignore_errors=True)
    try:
        status, error = _finish(run, rc)
        if rc == 0 and status == "failed":
            rc = NOT_ATTACHED_EXIT  # ran, but nothing could be measured: say so
    except RunDirError as exc:  # e.g. a full disk: say so, but keep the command's status
        sys.stderr.write(f"stepscope: final status not recorded: {exc}\n")
        status, error = "unknown", str(exc)
    return LaunchOutcome(run.path, rc, status, error, prof_dir)


def _child_env(boot: Path, run_path: Path, name: str, profile_steps: str | None,
               prof_dir: Path | None, extra: Mapping[str, str] | None) -> dict[str, str]:
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[2])  # the dir holding `stepscope/`
    parts = [str(boot), pkg_root] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                     if p]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    env["STEPSCOPE_RUN_DIR"] = str(run_path.resolve())
    if name:
        env["STEPSCOPE_RUN_NAME"] = name
    if profile_steps and prof_dir is not None:
        env["STEPSCOPE_PROFILE_STEPS"] = profile_steps
        env["STEPSCOPE_PROFILE_DIR"] = str(prof_dir.resolve())
    env.update(extra or {})
    return env


def _run(command: list[str], env: dict[str, str], grace_s: float) -> int:
    # Own process group, signals forwarded, grace then SIGKILL, leftovers ended (supervise).
    return run_child(command, env, grace_s=grace_s)


def _finish(run: RunDir, rc: int) -> tuple[str, str | None]:
    """Final status in run.json from the child's exit and what the ranks recorded."""
    meta = run.read_meta()
    if rc == 0:
        unattached = _not_attached(run)
        if unattached is not None:
            run.update_meta(status="failed", error=unattached)
            return "failed", unattached
        if meta.status == "running":  # no instrumented rank closed (e.g. no steps at all)
            meta = run.update_meta(status="finished")
        return meta.status, meta.error
    rank, first = _first_crash(run)
    if meta.status == "failed" and meta.error and rank in (None, 0):
        return meta.status, meta.error  # rank 0's own exception, already in run.json
    if first is not None:
        error = first
    elif rc < 0:
        error = f"killed by signal {signal.Signals(-rc).name}"
    else:
        error = f"exit code {rc}"
    run.update_meta(status="failed", error=error)
    return "failed", error


def _not_attached(run: RunDir) -> str | None:
    """The one-line reason when a framework was imported but no step was recorded."""
    if any(p.stat().st_size for p in run.step_files()):
        return None
    events, _ = run.read_events(type="attach_failed")
    if not events:
        return None
    e = events[0]
    return (f"{e.get('framework')} was imported but no training step was found: looked for "
            f"{e.get('looked_for')}; record steps with stepscope's callback or recorder "
            "instead")


def _first_crash(run: RunDir) -> tuple[int | None, str | None]:
    """(rank, description) of the earliest rank failure in events.jsonl, or (None, None).

    When one rank raises, the others fail after it (a peer closed the connection,
    torchrun's SIGTERM): the earliest is the cause, and run.json should name it.
    """
    crashes, _ = run.read_events(type="crash")
    if not crashes:
        return None, None
    crashes.sort(key=lambda c: c.get("wall_time_s") or float("inf"))
    first = crashes[0]
    text = f"{first.get('error')} (rank {first.get('rank')}, step {first.get('step')})"
    others = sorted({c.get("rank") for c in crashes[1:]} - {first.get("rank")},
                    key=lambda r: -1 if r is None else int(r))
    if others:
        text += f"; then rank{'s' if len(others) > 1 else ''} " \
            f"{', '.join(map(str, others))} stopped"
    rank = first.get("rank")
    return (int(rank) if isinstance(rank, int) else None), text


def python_executable() -> str:
    """The interpreter running stepscope (tests use it to launch scripts)."""
    return sys.executable
