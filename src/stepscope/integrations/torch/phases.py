"""The phase clock of the zero-code instrumentation: which phase the training thread is in.

The global hooks (:mod:`.hooks`) tell it when a counted module call starts and ends (the
nesting depth: the outermost call is the forward), when backward runs, and when stepscope
runs the model itself (the FLOPs count: every hook stands by). Each phase is also marked
on the device (a CUDA event pair on the current stream, read one step later: no host
synchronisation) and, while a profiler captures, as a named range (:mod:`.profiling`).

Stack entries, one per module call in progress: 1 a counted call (autograd on), 0 not
counted, and the marks of :mod:`.loops` (an evaluation forward, its loss module).

Example::

    clock = PhaseClock(torch, window)
    clock.push(1); outermost = clock.enter()      # True: a forward starts
    clock.now()                                   # "forward"
"""

from __future__ import annotations

from typing import Any

from .profiling import ProfileWindow

__all__ = ["PhaseClock"]


class PhaseClock:
    """Depth of counted module calls, backward in progress, device marks per phase."""

    def __init__(self, torch: Any, window: ProfileWindow) -> None:
        self.torch = torch
        self.window = window
        self.depth = 0  # counted module calls in progress (0: outside any forward)
        self.stack: list[int] = []  # one entry per module call in progress (docstring)
        self.in_backward = False
        self.quiet = False  # stepscope runs the model itself (FLOPs count): hooks stand by
        self.cuda = False  # device marks as CUDA events
        self._dev_open: dict[str, Any] = {}

    def now(self) -> str:
        """The phase running now (communication intervals are tagged with it)."""
        if self.in_backward:
            return "backward"
        return "forward" if self.depth > 0 else "other"

    # -- module calls and backward (the hooks' calls) ----------------------------------
    def push(self, mark: int) -> None:
        self.stack.append(mark)

    def pop(self) -> int | None:
        """The innermost call's stack entry; None when the stack is empty."""
        return self.stack.pop() if self.stack else None

    def enter(self) -> None:
        self.depth += 1

    def leave(self) -> bool:
        """A counted call ended; True when it was the outermost (the forward ended)."""
        self.depth -= 1
        return self.depth == 0

    def backward(self, running: bool) -> None:
        self.in_backward = running

    def stand_by(self, quiet: bool) -> None:
        self.quiet = quiet

    def on_device(self, cuda: bool) -> None:
        self.cuda = cuda

    # -- device-time marks (CUDA events; nothing on CPU) --------------------------------
    def begin(self, phase: str) -> None:
        """Mark a phase start on the current CUDA stream (no host synchronisation), and
        in the profiler capture while one runs."""
        self.window.mark_begin(phase)
        if self.cuda:
            self._dev_open[phase] = self.event()

    def end(self, phase: str, dev: list[tuple[str, Any, Any]]) -> None:
        """Mark a phase end; on CUDA its (phase, start, end) events go to ``dev``."""
        self.window.mark_end(phase)
        start = self._dev_open.pop(phase, None) if self.cuda else None
        if start is not None:
            dev.append((phase, start, self.event()))

    def event(self) -> Any:
        ev = self.torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev
