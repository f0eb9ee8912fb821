"""The ``STEPSCOPE_PROFILE_STEPS`` window of the zero-code instrumentation: a
``torch.profiler`` capture of steps [start, stop), its trace saved per rank, and the
phase marks (:mod:`.marks`) that split the trace as the records split the step."""

from __future__ import annotations

import os
from typing import Any

from .failures import Failures
from .marks import PhaseMarks

__all__ = ["ProfileWindow"]


class ProfileWindow:
    """The capture of steps [start, stop) (none when ``window`` is None or no ``out_dir``)."""

    def __init__(self, torch: Any, window: tuple[int, int] | None, out_dir: str,
                 failures: Failures) -> None:
        self.torch = torch
        self.window = window if out_dir else None
        self.out_dir = out_dir
        self.failures = failures
        self.prof: Any = None  # the running torch.profiler.profile
        self.marks = PhaseMarks(torch)

    def mark_begin(self, phase: str) -> None:
        self.marks.begin(phase, active=self.prof is not None)

    def mark_end(self, phase: str) -> None:
        self.marks.end(phase)

    def step(self, n: int, rank: int) -> None:
        """Profile steps [start, stop): ``n`` steps are complete, so step ``n`` begins now."""
        if self.window is None:
            return
        start, stop = self.window
        prof = self.prof
        if prof is None and n == start:
            self.prof = self._start(start, stop, rank)
        elif prof is not None:
            prof.step()  # closes ProfilerStep#(n-1); at n == stop the schedule saves the trace
            if n >= stop:
                self.stop()

    def _start(self, start: int, stop: int, rank: int) -> Any:
        torch = self.torch
        prof_mod = torch.profiler
        acts = [prof_mod.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            acts.append(prof_mod.ProfilerActivity.CUDA)
        action = prof_mod.ProfilerAction
        path = os.path.join(self.out_dir, f"rank-{rank:05d}.pt.trace.json")

        def schedule(step: int) -> Any:  # a schedule makes the profiler mark ProfilerStep#N
            if step < stop - 1:
                return action.RECORD
            return action.RECORD_AND_SAVE if step == stop - 1 else action.NONE

        prof = prof_mod.profile(activities=acts, schedule=schedule, record_shapes=False,
                                on_trace_ready=lambda p: p.export_chrome_trace(path))
        prof.step_num = start  # ProfilerStep#<n> then matches the step table's index
        prof.start()
        return prof

    def stop(self) -> None:
        """Stop a capture still running (run ended early); the trace is saved on stop."""
        prof = self.prof
        if prof is None:
            return
        self.prof = None
        self.marks.close_all()  # a phase still open (the run ended inside it) ends here
        try:
            prof.stop()
        except Exception as exc:
            self.failures.failed("profiler export", exc)
