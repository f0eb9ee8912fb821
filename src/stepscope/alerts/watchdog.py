"""The in-process stall watchdog: a daemon thread that notices when no step finishes.

It only reads a step counter and, when it fires, the training thread's Python stack
(``sys._current_frames``): no collective, no lock the training thread takes, nothing that
can block training. A frozen *process* (SIGSTOP, a hung driver holding the GIL) stops this
thread too; ``stepscope watch`` covers that from outside.

Example::

    dog = StallWatchdog(lambda: rec.steps_recorded, threading.get_ident(),
                        limit_s=lambda: 600.0, fire=dispatcher.submit, run="exp1", rank=0)
    dog.start()
    ...
    dog.stop()
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from collections.abc import Callable

from .model import Alert

__all__ = ["StallWatchdog", "thread_stack"]

# Frames of the stack shown in the alert: the innermost ones say what it is blocked in.
_STACK_FRAMES = 25


def thread_stack(ident: int) -> tuple[str, str]:
    """(the innermost frame as ``func (file:line)``, the formatted stack) of a thread."""
    frame = sys._current_frames().get(ident)
    if frame is None:
        return "an unknown place (the thread has exited)", ""
    summary = traceback.extract_stack(frame, limit=None)[-_STACK_FRAMES:]
    inner = summary[-1]
    where = f"{inner.name} ({inner.filename}:{inner.lineno})"
    return where, "".join(traceback.format_list(summary)).rstrip()


class StallWatchdog:
    """Fires one critical ``stall`` alert per stall: no progress for ``limit_s()`` seconds."""

    def __init__(self, progress: Callable[[], int], thread_ident: int,
                 limit_s: Callable[[], float], fire: Callable[[Alert], object], run: str,
                 rank: int, clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time, poll_s: float = 1.0) -> None:
        self._progress, self._ident, self._limit_s = progress, thread_ident, limit_s
        self._fire, self._run, self._rank = fire, run, rank
        self._clock, self._wall, self._poll_s = clock, wall, poll_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="stepscope-watchdog",
                                        daemon=True)
        self.fired = 0
        self._last, self._since, self._armed = progress(), clock(), True

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=2.0)

    def check(self, now: float, count: int) -> Alert | None:
        """One look at the counter at time ``now``: the alert if a stall starts firing."""
        if count != self._last:
            self._last, self._since, self._armed = count, now, True
            return None
        limit = self._limit_s()
        if self._armed and limit > 0 and now - self._since >= limit:
            self._armed = False
            self.fired += 1
            return self._alert(now - self._since, count, limit)
        return None

    def _loop(self) -> None:
        while not self._stop.wait(self._poll()):
            try:
                alert = self.check(self._clock(), self._progress())
                if alert is not None:
                    self._fire(alert)
            except Exception as exc:  # the watchdog must never take the job down
                print(f"stepscope: stall watchdog error (continuing): {exc!r}",
                      file=sys.stderr)

    def _poll(self) -> float:
        try:
            limit = self._limit_s()
        except Exception:
            limit = 0.0
        return max(0.05, min(self._poll_s, limit / 5 if limit > 0 else self._poll_s))

    def _alert(self, stalled_s: float, steps: int, limit_s: float) -> Alert:
        where, stack = thread_stack(self._ident)
        return Alert(
            rule="stall", severity="critical", run=self._run, rank=self._rank, step=steps,
            message=f"no step finished for {stalled_s:.0f} s (limit {limit_s:g} s); the "
                    f"training thread is in {where}",
            next_step="read the stack: a collective waiting for another rank, a data "
                      "loader stuck on storage, a deadlock; py-spy dump --pid shows all threads",
            source="stepscope stall watchdog",
            values={"stalled_s": stalled_s, "stall_after_s": limit_s,
                    "steps_done": float(steps)},
            detail=stack, time_s=self._wall())
