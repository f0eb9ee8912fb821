"""Phase marks in a profiler capture: forward, backward and optimizer as named ranges.

While `stepscope run --profile-steps` captures, each phase the hooks time is also opened
as ``torch.profiler.record_function("stepscope.<phase>")``, so the trace splits phases
the way the live records do (``analysis.trace.steps`` reads ``stepscope.forward`` ...).
Outside a capture nothing is opened: a mark costs nothing when no profiler runs.

Example::

    marks = PhaseMarks(torch)
    marks.begin("forward", active=True); ...; marks.end("forward")
"""

from __future__ import annotations

from typing import Any

__all__ = ["PhaseMarks", "MARK_PREFIX"]

MARK_PREFIX = "stepscope."


class PhaseMarks:
    """Open and close one ``record_function`` range per phase name."""

    def __init__(self, torch: Any) -> None:
        self._record = torch.profiler.record_function
        self._open: dict[str, Any] = {}

    def begin(self, phase: str, active: bool) -> None:
        """Open ``stepscope.<phase>`` when ``active`` (a profiler is capturing)."""
        if not active or phase in self._open:
            return
        rf = self._record(MARK_PREFIX + phase)
        rf.__enter__()
        self._open[phase] = rf

    def end(self, phase: str) -> None:
        rf = self._open.pop(phase, None)
        if rf is not None:
            rf.__exit__(None, None, None)

    def close_all(self) -> None:
        """Close every open range (before the profiler stops)."""
        for phase in list(self._open):
            self.end(phase)
