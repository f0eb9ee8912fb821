"""Steps measured on the callback's hot path, recorded in batches off it.

The budget for ``StepscopeCallback`` is 50 µs of CPU a step. Measured inside a
running ``Model.train`` (benchmarks/ms_callback_overhead.py), the same Python costs 5-7x
what it costs in a warm loop: each hook starts cold after milliseconds of compute, so a
step path of ~200 Python calls (row building, loss check, queueing) took ~150 µs where a
warm loop took ~20 µs. So the step hooks only take the clock, the loss and the batch's
counts into a tuple (:meth:`StepBatch.add`), and every ``MAX_PENDING`` steps or
``MAX_AGE_S`` seconds the tuples become rows in one warm pass (:meth:`StepBatch.drain`),
through the same :meth:`StepSession.record` as every adapter. The pass is stepscope's own
time: it is billed to the next row's ``tool_s``, never to its data wait.

The process's CPU time per row (``cpu_s``, ``preempt``) is read once per pass and shared
out in proportion to each row's time since the previous row (:class:`UsageFeed`), so the
columns keep their meaning (CPU time between step ends).

Example::

    batch = StepBatch(session, feed, finish=lambda raw: (16, 16, raw, {}, ""))
    batch.add(t_begin, t_end, loss)       # in the hooks
    batch.drain()                         # at train end
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from ...record.recorder import _rusage  # the recorder's own reading (one definition)
from ...record.session import StepSession

__all__ = ["StepBatch", "UsageFeed", "MAX_PENDING", "MAX_AGE_S"]

# 64 steps or 0.25 s, whichever comes first: the writer thread flushes every 0.5 s
# (recorder flush_interval_s), so rows handed over sooner are never written sooner.
MAX_PENDING = 64
MAX_AGE_S = 0.25

Usage = tuple[float, float]
# raw step -> (tokens, samples, loss or None, values, what the outputs were without a loss)
Finish = Callable[[Any], tuple[float, float, "float | None", dict[str, float], str]]


class UsageFeed:
    """The recorder's ``usage`` source: the real counters, or the share a batch pass set."""

    def __init__(self, read: Callable[[], Usage] = _rusage) -> None:
        self.read = read
        self.value: Usage | None = None

    def __call__(self) -> Usage:
        return self.read() if self.value is None else self.value


class StepBatch:
    """Pending steps of one session (see the module docstring)."""

    def __init__(self, core: StepSession, feed: UsageFeed | None, finish: Finish,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        self.core, self.feed, self.finish, self.clock = core, feed, finish, clock
        self.pending: list[tuple[Any, ...]] = []
        self.prev_end = clock()  # the previous step's end (or the train/epoch begin)
        self.first_end = math.nan  # end of the oldest pending step
        self.first = True
        self.usage_last = feed.read() if feed is not None else (0.0, 0.0)

    def restart(self) -> None:
        """A new epoch or Model.train call: what happens before its first step is not
        data wait (the session's ``restart_wait``)."""
        self.drain()
        self.prev_end = self.clock()

    def add(self, begin_s: float, end_s: float, raw: Any) -> None:
        """One step measured in the hooks (``raw``: what ``finish`` turns into the row's
        contents); drains when the batch is full or old."""
        self.pending.append((begin_s, end_s, raw))
        if len(self.pending) == 1:
            self.first_end = end_s
        if len(self.pending) >= MAX_PENDING or end_s - self.first_end >= MAX_AGE_S \
                or self.first:
            self.first = False  # the first step at once: run.json and warnings early
            self.drain()

    def drain(self) -> None:
        """Record the pending steps as rows now (one warm pass)."""
        if not self.pending:
            return
        t0 = self.clock()
        rows, self.pending = self.pending, []
        wall_offset = time.time() - t0
        shares = self._usage_shares(rows)
        core, prev, finish = self.core, self.prev_end, self.finish
        for i, (begin, end, raw) in enumerate(rows):
            if self.feed is not None:
                self.feed.value = shares[i]
            tokens, samples, loss, values, missing = finish(raw)
            wait = max(0.0, begin - prev)
            core.record(begin - wait, end, wall_end_s=end + wall_offset, tokens=tokens,
                        samples=samples, phases={"data_wait": wait}, values=values,
                        loss=loss, missing_loss=missing)
            prev = end
        if self.feed is not None:
            self.feed.value = None
        core.own_time(t0)  # the pass is stepscope's time: the next row's tool_s
        self.prev_end = self.clock()

    def _usage_shares(self, rows: list[tuple[Any, ...]]) -> list[Usage]:
        """Cumulative (CPU s, switches) at each row's end, interpolated over its time."""
        if self.feed is None:
            return []
        now = self.feed.read()
        last, t_from = self.usage_last, self.prev_end
        span = rows[-1][1] - t_from
        self.usage_last = now
        out = []
        for r in rows:
            f = (r[1] - t_from) / span if span > 0 else 1.0
            out.append((last[0] + (now[0] - last[0]) * f, last[1] + (now[1] - last[1]) * f))
        return out
