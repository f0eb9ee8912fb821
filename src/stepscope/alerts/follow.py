"""Following a run from outside (``stepscope watch``): the step files, the processes.

A separate process sees what a thread inside training cannot: a frozen process (SIGSTOP,
a driver holding the GIL) makes no progress while its process id is still there; a killed
one leaves run.json saying "running" while its process id is gone from this host; a job
that never started writing has no step records at all. The same live rules as in-process
run over the records as they are appended.

Liveness comes from the ``{"type": "process", "rank", "pid", "hostname"}`` record each
rank's recorder appends to events.jsonl when it starts. Time is passed in (``poll(now)``).

Example::

    w = RunWatcher(RunDir.open("runs/exp1"), RulesConfig(), stall_after_s=600.0)
    while not w.done:
        for alert in w.poll(time.monotonic(), time.time()):
            dispatcher.submit(alert)
        time.sleep(1.0)
"""

from __future__ import annotations

import errno
import os
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..analysis.health.config import HealthConfig
from ..rundir.store import CONDITIONS_DIR, RunDir
from .config import RulesConfig
from .model import Alert, Severity
from .ranks import StragglerRule
from .rules import LiveRules, record_value
from .tail import JsonlTail

__all__ = ["RunWatcher", "pid_state"]

_SRC = "stepscope watch"
# A process id must stay gone this long with run.json still "running" before it is
# reported: the ranks of a job that finishes normally exit a moment apart from rank 0,
# which marks the run finished.
_GONE_GRACE_S = 5.0


def pid_state(pid: int) -> str | None:
    """The process's state letter from /proc (R, S, D, T, Z, ...); None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
        return stat[stat.rindex(b")") + 2:][:1].decode()
    except FileNotFoundError:
        return None
    except OSError:
        try:  # no /proc (macOS): signal 0 only says whether it exists
            os.kill(pid, 0)
        except OSError as exc:
            return None if exc.errno == errno.ESRCH else "?"
        return "?"


@dataclass
class _Rank:
    rank: int
    rules: LiveRules
    last_step: int | None = None
    last_progress_s: float = 0.0
    pid: int | None = None
    local: bool = False
    gone_since_s: float | None = None
    reported: set[str] = field(default_factory=set)


class RunWatcher:
    """Polls one run directory; ``poll`` returns the alerts found since the last poll."""

    def __init__(self, run: RunDir, rules: RulesConfig, stall_after_s: float = 0.0,
                 health: HealthConfig | None = None,
                 state_of: Callable[[int], str | None] = pid_state) -> None:
        self.run = run
        self.rules_cfg = rules
        self.health = health or HealthConfig()
        self.stall_after_s = stall_after_s or rules.stall_after_s
        self.name = self._name()
        self._state_of = state_of
        self._tails: dict[Path, JsonlTail] = {}
        self._events = JsonlTail(run.events_path)
        self._stragglers = StragglerRule(self.name, rules.consecutive)
        self._ranks: dict[int, _Rank] = {}
        self._started_s: float | None = None
        self._no_steps_reported = False
        self.status = "running"
        self.done = False

    def _name(self) -> str:
        try:
            meta = self.run.read_meta()
            return meta.name or meta.run_id
        except Exception:  # a run.json being rewritten: the directory name will do
            return self.run.path.name

    def _rank(self, rank: int, now: float) -> _Rank:
        r = self._ranks.get(rank)
        if r is None:
            r = _Rank(rank, LiveRules(self.rules_cfg, self.name, rank, self.health),
                      last_progress_s=now)
            self._ranks[rank] = r
        return r

    def stall_limit_s(self, r: _Rank) -> float:
        """Explicit limit, else stall_factor x the steady median, at least stall_min_s."""
        if self.stall_after_s > 0:
            return self.stall_after_s
        med = r.rules.steady_median_s()
        auto = self.health.stall_factor * med if med else 0.0
        return max(self.rules_cfg.stall_min_s, auto)

    def poll(self, now: float, wall: float) -> list[Alert]:
        """Read what was appended, apply the rules, check progress and the processes."""
        if self._started_s is None:
            self._started_s = now
        out: list[Alert] = []
        self._read_processes(now)
        for ev in self._events.read():
            if ev.get("type") == "cross_rank" and "straggler" not in self.rules_cfg.disable:
                out.extend(self._stragglers.observe(ev, wall))
        for path in sorted((self.run.path / CONDITIONS_DIR).glob("rank-*.jsonl")):
            tail = self._tails.setdefault(path, JsonlTail(path))
            rank = self._rank(int(path.stem.split("-")[-1]), now)
            for sample in tail.read():
                rank.rules.observe_conditions(sample)
        for path in self.run.step_files():
            tail = self._tails.setdefault(path, JsonlTail(path))
            for rec in tail.read():
                out.extend(self._record(rec, now, wall))
        self._read_status()
        if self.status != "running":
            self.done = True
            return out
        for r in self._ranks.values():
            out.extend(self._liveness(r, now, wall))
        out.extend(self._never_started(now, wall))
        if self._ranks and all("gone" in r.reported for r in self._ranks.values()):
            self.done = True
        return out

    def _record(self, rec: dict[str, Any], now: float, wall: float) -> list[Alert]:
        rank_v = record_value(rec, "rank")
        r = self._rank(int(rank_v) if rank_v is not None else 0, now)
        step = rec.get("step")
        if isinstance(step, int) and step != r.last_step:
            r.last_step = step
            r.last_progress_s = now
            r.reported.discard("frozen")
        return r.rules.observe(rec, wall)

    def _read_processes(self, now: float) -> None:
        if self._ranks and all(r.pid is not None for r in self._ranks.values()):
            return
        try:
            events, _ = self.run.read_events(type="process")
        except Exception:
            return
        host = socket.gethostname()
        for ev in events:
            if isinstance(ev.get("rank"), int) and isinstance(ev.get("pid"), int):
                r = self._rank(ev["rank"], now)
                r.pid, r.local = ev["pid"], ev.get("hostname") == host

    def _read_status(self) -> None:
        try:
            self.status = self.run.read_meta().status
        except Exception:
            pass  # being rewritten right now; the next poll reads it

    def _alert(self, rule: str, severity: Severity, r: _Rank | None, message: str,
               next_step: str, values: dict[str, float], wall: float, detail: str = ""
               ) -> Alert:
        return Alert(rule=rule, severity=severity, run=self.name,
                     rank=None if r is None else r.rank,
                     step=None if r is None else r.last_step, message=message,
                     next_step=next_step, source=_SRC, values=values, detail=detail,
                     time_s=wall)

    def _liveness(self, r: _Rank, now: float, wall: float) -> list[Alert]:
        state = self._state_of(r.pid) if r.pid is not None and r.local else "?"
        if r.pid is not None and r.local and (state is None or state == "Z"):
            if r.gone_since_s is None:
                r.gone_since_s = now
            if "gone" in r.reported or now - r.gone_since_s < _GONE_GRACE_S:
                return []
            r.reported.add("gone")
            return [self._alert(
                "process_gone", "critical", r,
                f"training process {r.pid} is gone from this host (killed?) while the run "
                f"is still marked running; last step {r.last_step}",
                "look at the job's log and the kernel log (OOM killer: dmesg); resume from "
                "the last checkpoint", {"pid": float(r.pid)}, wall)]
        limit = self.stall_limit_s(r)
        idle = now - r.last_progress_s
        if idle < limit or "frozen" in r.reported:
            return []
        r.reported.add("frozen")
        how = {"T": "stopped (SIGSTOP or a debugger)", "D": "in uninterruptible I/O (a hung "
               "driver or file system)", "?": "alive"}.get(state or "?", f"in state {state}")
        return [self._alert(
            "frozen", "critical", r,
            f"no step for {idle:.0f} s (limit {limit:g} s); process {r.pid} is {how}",
            "the process makes no progress: py-spy dump --pid shows where it is; a stopped "
            "process continues with kill -CONT", {"idle_s": idle, "stall_after_s": limit},
            wall, detail=_py_spy(r.pid) if r.pid is not None and r.local else "")]

    def _never_started(self, now: float, wall: float) -> list[Alert]:
        if self._no_steps_reported or any(r.last_step is not None
                                          for r in self._ranks.values()):
            return []
        assert self._started_s is not None
        limit = self.stall_after_s or self.rules_cfg.stall_min_s
        if now - self._started_s < limit:
            return []
        self._no_steps_reported = True
        return [self._alert(
            "no_steps", "warning", None,
            f"the run has written no step for {now - self._started_s:.0f} s since the watch "
            "started", "check that the job started and reached its training loop",
            {"waited_s": now - self._started_s}, wall)]


def _py_spy(pid: int) -> str:
    """``py-spy dump`` of a frozen process, where py-spy is installed; else ""."""
    exe = shutil.which("py-spy")
    if exe is None:
        return ""
    try:
        # --nonblocking reads the stacks without suspending the process: a process that is
        # already stopped (SIGSTOP) cannot be suspended again, and py-spy fails without it.
        proc = subprocess.run([exe, "dump", "--nonblocking", "--pid", str(pid)],
                              capture_output=True, text=True, timeout=10.0)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout.strip()
