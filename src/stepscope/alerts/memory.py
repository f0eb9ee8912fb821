"""Memory creep, live: the peak of the steady steps, judged as a trend in two windows.

The judgement is the health rules' :func:`~stepscope.analysis.health.system.memory_creep`
(growth between the first and last quarter, Spearman rank correlation with the step, and
Theil-Sen slopes that keep rising in both halves), so ``diagnose`` after the run and the
alert during it say the same thing. It is applied to two windows: the latest
``RECENT_STEPS`` steps (a leak that starts late, hours into a flat run) and the whole
steady history thinned to at most ``HISTORY_POINTS`` points (a slow leak that adds a few
hundred KiB per step). Pure: no clock, no I/O.

Example::

    trend = MemoryTrend(HealthConfig())
    for step, peak in enumerate(peaks):
        creep = trend.push(step, peak)      # a MemoryCreep once it is creep, else None
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..analysis.health.config import HealthConfig
from ..analysis.health.system import MemoryCreep, memory_creep

__all__ = ["MemoryTrend", "MIN_POINTS", "RECENT_STEPS", "HISTORY_POINTS", "EVERY_STEPS"]

# A window is judged once it holds 40 steady steps: a quarter (10 steps) rides over one-off
# allocations, and the first alert comes within a minute or two of steady state.
MIN_POINTS = 40
# The recent window: 200 steps (32 MiB of growth in 200 steps is 160 KiB per step, an
# out-of-memory within a day on a 24 GB device at one step per second).
RECENT_STEPS = 200
# The whole history, thinned by halving when full (every 2nd, 4th, ... step kept).
HISTORY_POINTS = 256
# Judged every 10 steps: a trend does not change in one step, and each judgement sorts
# a few hundred numbers on the writer thread.
EVERY_STEPS = 10


class MemoryTrend:
    """Pushes (step, peak bytes); ``push`` returns the creep when a window shows one."""

    def __init__(self, health: HealthConfig) -> None:
        self.health = health
        self.recent: deque[tuple[float, float]] = deque(maxlen=RECENT_STEPS)
        self.history: list[tuple[float, float]] = []
        self._stride = 1
        self._seen = 0

    def push(self, step: float, peak_bytes: float) -> MemoryCreep | None:
        self.recent.append((step, peak_bytes))
        if self._seen % self._stride == 0:
            self.history.append((step, peak_bytes))
            if len(self.history) > HISTORY_POINTS:
                self.history = self.history[::2]
                self._stride *= 2
        self._seen += 1
        if self._seen % EVERY_STEPS:
            return None
        for window in (self.recent, self.history):
            if len(window) >= MIN_POINTS:
                xy = np.asarray(window, dtype=float)
                creep = memory_creep(xy[:, 0], xy[:, 1], self.health)
                if creep is not None:
                    return creep
        return None
