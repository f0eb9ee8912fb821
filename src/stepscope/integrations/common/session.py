"""What every framework adapter does around a step, framework-free.

A ``StepSession`` wraps a :class:`~stepscope.recorder.Recorder` and adds, per step: the
"is a loss being recorded" check (``losscheck``), memory, the low-frequency cross-rank
gather (``crossrank``; the adapter injects its framework's all-gather) and profiler-capture
hooks (the adapter injects a capture object). Adapters only read framework state and call
``begin``/``end``; the clock, the gather and the memory probe are injected, so this is
tested with exact numbers and no framework.

Example::

    s = StepSession(rec, rank=0, world=2, loss_source="the custom loop",
                    gather=my_all_gather, every=50)
    s.begin(step, tokens=4096, samples=8, wait_s=0.01)
    ...                                   # the adapter's step, phases via rec
    s.end(step, {"lr": 1e-3}, loss=2.3, what="")
    s.close()
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from ...envinfo import process_memory_bytes
from ...recorder import Recorder
from .crossrank import WindowStats, cross_rank_event
from .losscheck import LossWatch

__all__ = ["StepSession", "Capture", "CROSS_RANK_NAMES"]

# Per-rank quantities gathered; stragglers are scored on compute_s (step time without the
# data wait and the timed communication, where a fast rank waits for a slow one).
CROSS_RANK_NAMES: tuple[str, ...] = ("step_time_s", "data_wait_s", "compute_s")
Gather = Callable[[list[float]], Sequence[Sequence[float]]]


class Capture(Protocol):
    """Profiler capture hooks (e.g. ``integrations.mindspore.profile.ProfileCapture``)."""

    def before_step(self, step: int) -> None: ...

    def after_step(self, step: int) -> None: ...

    def active(self, step: int) -> bool: ...

    def close(self) -> None: ...


class StepSession:
    """Recorder + loss check + memory + cross-rank gather + capture, per step."""

    def __init__(self, rec: Recorder, *, rank: int, world: int, loss_source: str,
                 gather: Gather | None = None, every: int = 0, capture: Capture | None = None,
                 mem_probe: Callable[[], tuple[float, float]] = process_memory_bytes,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.rec, self.rank, self.world = rec, rank, world
        self.watch = LossWatch(loss_source)
        self.window = WindowStats(CROSS_RANK_NAMES)
        self.every = int(every) if world > 1 and gather is not None else 0
        self.gather, self.capture = gather, capture
        self.mem_probe, self.clock = mem_probe, clock
        self._t0 = 0.0
        self._wait = 0.0

    def begin(self, step: int, tokens: float, samples: float, wait_s: float = 0.0) -> None:
        """Open the step (``wait_s``: data wait before it, already given to the recorder)."""
        if self.capture is not None:
            t = self.clock()
            self.capture.before_step(step)  # may start the profiler: stepscope's own time
            self.rec.add_time("tool", self.clock() - t)
        self._wait = wait_s
        self.rec.start_step(tokens, samples)
        self._t0 = self.clock()

    def end(self, step: int, values: dict[str, float], loss: float | None, what: str) -> None:
        """Close the step: loss check, memory, record, capture, cross-rank gather."""
        finding = self.watch.observe(step, loss, what)
        if finding is not None:
            finding.rank = self.rank
            self.rec.run.append_event({"type": "finding", **finding.to_dict()})
        if loss is not None:
            values["loss"] = loss
        values["mem_peak_bytes"], values["mem_alloc_bytes"] = self.mem_probe()
        comm = self.rec.open_value("comm_s")
        self.rec.log(**values)
        step_time = self.clock() - self._t0 + self._wait
        self.rec.end_step()
        t_tool = self.clock()
        if self.capture is not None:
            self.capture.after_step(step)  # may stop the profiler (~1 s on CPU)
        if self.capture is None or not self.capture.active(step):  # profiled: distorted
            comm = 0.0 if math.isnan(comm) else comm
            self.window.add(step_time_s=step_time, data_wait_s=self._wait,
                            compute_s=step_time - self._wait - comm)
        if self.every and (step + 1) % self.every == 0:
            self._gather(step)
        self.rec.add_time("tool", self.clock() - t_tool)  # goes to the next step

    def _gather(self, step: int) -> None:
        assert self.gather is not None
        try:
            rows = [list(map(float, r)) for r in self.gather(self.window.medians())]
        except Exception as exc:  # a failing gather must not stop training: say so once
            self.every = 0
            self.rec.run.append_event({"type": "warning", "rank": self.rank,
                                       "message": f"cross-rank gather disabled: {exc}"})
            return
        if self.rank == 0:
            self.rec.run.append_event(cross_rank_event(step, CROSS_RANK_NAMES, rows,
                                                       "compute_s"))

    def close(self, status: str = "finished", error: str | None = None) -> None:
        if self.capture is not None:
            self.capture.close()
        self.rec.close(status=status, error=error)

    def summary(self) -> dict[str, Any]:
        return {"steps_with_loss": self.watch.with_loss,
                "steps_without_loss": self.watch.without_loss}
