"""report.html at the end of ``stepscope run``, best effort.

The training's exit status is ``stepscope run``'s, whatever happens here, so the report is
made by a child process (``python -m stepscope.cli.run_html RUN``) that this one can bound:

* a run whose step files pass ``HTML_MAX_BYTES`` is not read at all (the note says how to
  write the report later: `stepscope report RUN`), and the child gets ``HTML_TIMEOUT_S``;
* a child that overruns, or a SIGINT/SIGTERM/SIGHUP that arrives meanwhile (a scheduler
  ending the job), ends the child's whole session and removes the temporary files it left
  (``.NAME.PID.tmp`` beside report.html and in the step cache);
* every failure is one line, never an exception.

Example::

    path, note = write_after_run(Path("runs/exp1"))
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

from ..report.fmt import fmt_bytes
from ..rundir.derived import derived_dir
from ..rundir.store import CACHE_DIR, RunDir

__all__ = ["write_after_run", "HTML_TIMEOUT_S", "HTML_MAX_BYTES"]

# Reading, diagnosing and drawing take ~5-10 s per 100 MiB of step records on one loaded
# core; past these the end of a run would keep a job's allocation for minutes.
HTML_TIMEOUT_S = 60.0
HTML_MAX_BYTES = 512 << 20
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_TMP = re.compile(r"^\..+\.(\d+)\.tmp$")


class _Stopped(Exception):
    """A terminating signal arrived while the report was being made."""


@contextlib.contextmanager
def _signals_stop() -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP raise :class:`_Stopped` instead of ending this process (its
    exit status is the training's); the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    stopped: list[int] = []

    def stop(signum: int, frame: FrameType | None) -> None:
        if not stopped:  # once: a second signal must not break the clean-up of the first
            stopped.append(signum)
            raise _Stopped(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in _STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _remove_leftovers(run: RunDir) -> None:
    """Temporary files of writers that no longer exist (the killed child and its pool's
    workers); a live writer's (another `stepscope report` of the run) are left alone."""
    places = [run.path]
    if derived_dir(run.path, CACHE_DIR) is not None:  # a link there is never followed
        for top, _dirs, _files in os.walk(run.cache_dir):  # os.walk does not follow links
            places.append(Path(top))
    for d in places:
        with contextlib.suppress(OSError):
            for p in d.iterdir():
                m = _TMP.match(p.name)
                if m and not _alive(int(m.group(1))):
                    with contextlib.suppress(OSError):
                        p.unlink()


def _end(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)  # its session: the reader's workers too
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=10)


def _last_line(err: bytes) -> str:
    lines = [ln.strip() for ln in err.decode("utf-8", "replace").splitlines() if ln.strip()]
    return lines[-1].removeprefix("stepscope: error: ") if lines else "no reason given"


def write_after_run(run_dir: Path, *, timeout_s: float = HTML_TIMEOUT_S,
                    max_bytes: int = HTML_MAX_BYTES) -> tuple[Path | None, str | None]:
    """(RUN/report.html, None) once written, else (None, why not in one line)."""
    run = RunDir(run_dir)
    try:
        size = sum(p.stat().st_size for p in run.step_files())
    except OSError as exc:
        return None, f"cannot read the step files: {exc}"
    if size == 0:
        return None, "no step was recorded"
    if size > max_bytes:
        return None, (f"{fmt_bytes(size)} of step records is more than the end of a run "
                      f"reads (over {fmt_bytes(max_bytes)}); `stepscope report {run_dir}` "
                      "writes it")
    env = dict(os.environ)
    pkg_root = str(Path(__file__).resolve().parents[2])  # this stepscope, not another one
    env["PYTHONPATH"] = os.pathsep.join([pkg_root, *filter(None, env.get("PYTHONPATH", "")
                                                         .split(os.pathsep))])
    env.pop("STEPSCOPE_RUN_DIR", None)  # the child is a reader, never a recorded process
    argv = [sys.executable, "-m", "stepscope.cli.run_html", str(run_dir)]
    note: str | None = None
    with _signals_stop():
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=env, start_new_session=True)
        except OSError as exc:
            return None, f"cannot start the report: {exc}"
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            note = (f"not done in {timeout_s:g} s, stopped; `stepscope report {run_dir}` "
                    "writes it")
        except _Stopped as exc:
            note = f"stopped by {exc}"
        finally:
            if proc.returncode is None:
                _end(proc)
    if note is not None:
        _remove_leftovers(run)
        return None, note
    if proc.returncode != 0:
        _remove_leftovers(run)
        return None, _last_line(err)
    return Path(out.decode("utf-8", "replace").strip()), None


def _main(argv: list[str]) -> int:
    """The child: write RUN/report.html, print its path; a failure is the last line of
    stderr and exit status 1."""
    from ..errors import StepscopeError
    from ..report.offline import write_html
    from ..rundir.run import Run

    try:
        path = write_html(Run.open(argv[0]))
    except (StepscopeError, OSError) as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    sys.stdout.write(f"{path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
