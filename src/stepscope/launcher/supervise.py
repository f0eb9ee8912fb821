"""Run a child command the way a scheduler expects its job to behave (``stepscope run``).

The child runs in its own session and process group (``setsid``). Signals sent to the
supervising process (``kill PID``, a container runtime stopping PID 1, a scheduler's
preemption notice, Ctrl-C in the terminal, which reaches only the supervisor's group) are
forwarded to the child's whole group, so ``torchrun`` and its workers see each signal once:

* SIGINT, SIGTERM, SIGHUP, SIGQUIT end the job: after forwarding, the child gets
  ``grace_s`` seconds (default :data:`DEFAULT_GRACE_S`) to checkpoint and exit before its
  group is SIGKILLed;
* SIGUSR1, SIGUSR2 are forwarded only (SLURM's ``--signal=USR1@60`` checkpoint notice);
* a signal ignored when stepscope started (``nohup stepscope run``: SIGHUP) stays ignored,
  by stepscope and by the child, and is not forwarded.

When the child exits, what is left of it gets SIGTERM and, after :data:`LEFTOVER_GRACE_S`,
SIGKILL, so nothing is orphaned: members of its process group, and every descendant seen
while it ran (``torchrun`` starts each worker in a session of its own, so a killed
``torchrun`` would otherwise leave its workers training). Except: when the child exited
by itself (an exit status, not a signal, and no stop signal was forwarded), descendants
in a session of their own (``start_new_session=True``, ``setsid``: an upload the script
detached on purpose) are left alone; only its process group's members are ended.
The return value is the child's status as :class:`subprocess.Popen` reports it (negative:
killed by that signal), never stepscope's own.

Example::

    rc = run_child(["torchrun", "--nproc-per-node", "2", "train.py"], env, grace_s=30)
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from ..errors import ConfigError

__all__ = ["run_child", "DEFAULT_GRACE_S", "FORWARDED", "TERMINATING"]

# Kubernetes' default terminationGracePeriodSeconds and SLURM's default KillWait are both
# 30 s: the time a job already gets between SIGTERM and SIGKILL from its scheduler.
DEFAULT_GRACE_S = 30.0
# Leftover group members after the child exited: they get this long after SIGTERM.
LEFTOVER_GRACE_S = 5.0
TERMINATING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
FORWARDED = TERMINATING + (signal.SIGUSR1, signal.SIGUSR2)
_POLL_S = 0.1
# How often the child's process tree is sampled (one /proc scan, a few ms).
_SCAN_S = 1.0

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None


class _Forwarder:
    """Signal handlers that pass each signal to the child's group and note the deadline."""

    def __init__(self, grace_s: float) -> None:
        self.pgid = 0  # set once the child exists; signals before that wait in _pending
        self.grace_s = grace_s
        self.deadline: float | None = None
        self.stopped = False  # a terminating signal was passed on
        self._pending: list[int] = []
        self._previous: dict[int, Handler] = {}

    def started(self, pgid: int) -> None:
        self.pgid = pgid
        for sig in self._pending:
            self._handle(sig, None)
        self._pending.clear()

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal.signal works only there; the caller keeps its own handling
        for sig in FORWARDED:
            if signal.getsignal(sig) is signal.SIG_IGN:
                continue  # nohup's SIGHUP: ignored here, and by the child (exec keeps it)
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if not self.pgid:
            self._pending.append(signum)
            return
        _killpg(self.pgid, signum)
        if signum in TERMINATING:
            self.stopped = True
            if self.deadline is None:
                self.deadline = time.monotonic() + self.grace_s


def _killpg(pgid: int, sig: int) -> bool:
    """Send ``sig`` to the group; False when no member is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # a member changed identity (setuid); nothing we may do
        return False


# A process is (pid, start time in clock ticks): a pid reused later is not the same process.
Proc = tuple[int, int]


def _proc_table() -> dict[Proc, int]:
    """{(pid, start time): parent pid} of every live process (Linux /proc; else empty)."""
    out: dict[Proc, int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue  # exited meanwhile
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) "
        if fields[0] == b"Z":
            continue  # already dead, only waiting for its parent to reap it
        out[(int(name), int(fields[19]))] = int(fields[1])
    return out


def _descendants(root: int, table: dict[Proc, int]) -> set[Proc]:
    children: dict[int, list[Proc]] = {}
    for proc, ppid in table.items():
        children.setdefault(ppid, []).append(proc)
    found: set[Proc] = set()
    todo = [root]
    while todo:
        for proc in children.get(todo.pop(), []):
            if proc not in found:
                found.add(proc)
                todo.append(proc[0])
    return found


def _alive(procs: set[Proc]) -> set[Proc]:
    table = _proc_table()
    return {p for p in procs if p in table}


def _signal_all(procs: set[Proc], pgid: int, sig: int) -> None:
    _killpg(pgid, sig)
    for pid, _ in procs:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


class _Watch:
    """The child's descendants, sampled every :data:`_SCAN_S` while it runs."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.seen: set[Proc] = set()
        self._next = 0.0

    def scan(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now >= self._next:
            self._next = now + _SCAN_S
            self.seen |= {p for p in _descendants(self.pid, _proc_table()) if p[0] != self.pid}


def _wait(proc: subprocess.Popen[bytes], fwd: _Forwarder, watch: _Watch) -> int:
    """Wait for the child; SIGKILL all of it once a forwarded signal's grace ran out."""
    while True:
        watch.scan()
        try:
            return proc.wait(timeout=_POLL_S)
        except subprocess.TimeoutExpired:
            pass
        if fwd.deadline is not None and time.monotonic() >= fwd.deadline:
            sys.stderr.write(f"stepscope: command still running {fwd.grace_s:g} s after the "
                             "signal; killing it (SIGKILL)\n")
            watch.scan(force=True)
            _signal_all(watch.seen, fwd.pgid, signal.SIGKILL)
            fwd.deadline = None


def _detached(procs: set[Proc], session: int) -> set[Proc]:
    """Those of ``procs`` in a session other than ``session`` (the child's)."""
    out = set()
    for p in procs:
        try:
            if os.getsid(p[0]) != session:
                out.add(p)
        except OSError:
            pass  # gone
    return out


def _end_leftovers(pgid: int, seen: set[Proc]) -> None:
    """SIGTERM, then SIGKILL, whatever of the child outlived it (see the module docstring)."""
    left = _alive(seen)
    if not left and not _killpg(pgid, 0):
        return
    sys.stderr.write("stepscope: processes of the command outlived it; ending them\n")
    _signal_all(left, pgid, signal.SIGTERM)
    end = time.monotonic() + LEFTOVER_GRACE_S
    while time.monotonic() < end:
        left = _alive(left)
        if not left and not _killpg(pgid, 0):
            return
        time.sleep(_POLL_S)
    _signal_all(left, pgid, signal.SIGKILL)


def run_child(command: list[str], env: dict[str, str],
              grace_s: float = DEFAULT_GRACE_S) -> int:
    """Run ``command`` in its own process group, forwarding signals; its exit status."""
    if not grace_s >= 0:
        raise ConfigError(f"grace period must be >= 0 seconds, got {grace_s}")
    # Handlers first: a signal that arrives while the child starts is passed on, not lost.
    fwd = _Forwarder(grace_s)
    fwd.install()
    proc: subprocess.Popen[bytes] | None = None
    try:
        try:
            proc = subprocess.Popen(command, env=env, start_new_session=True)
        except OSError as exc:
            raise ConfigError(f"cannot start {command[0]!r}: {exc}") from exc
        fwd.started(proc.pid)
        watch = _Watch(proc.pid)
        rc = _wait(proc, fwd, watch)
    except BaseException:
        if proc is not None:  # e.g. a KeyboardInterrupt outside the main thread: no orphan
            _killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        raise
    finally:
        fwd.restore()
    seen = watch.seen
    if rc >= 0 and not fwd.stopped:  # it ended by itself: what it detached is its own
        seen -= _detached(seen, proc.pid)
    _end_leftovers(proc.pid, seen)
    return rc
