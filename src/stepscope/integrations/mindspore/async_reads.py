"""Per-step reads that cost no device sync and no I/O on the training thread.

The callback's per-step budget is 50 µs (a /proc read and extra syncs once cost
~1.5 ms a step, +16% on a 9.45 ms graph-mode step). Two reads were the cost:

* memory: :class:`MemSampler` reads ``/proc/self/status`` on a daemon thread every
  ``interval_s`` and the step takes the latest pair (peak RSS is a lifetime high-water
  mark, so a sample up to ``interval_s`` old loses nothing of the peak's meaning);
* batch counts: a tensor's dtype costs ~18 µs to read in a callback; :class:`BatchCounter`
  reads it once per batch shape (a dataset's columns keep their dtype);
* learning rate: ``optimizer.get_lr()`` runs an op and reads it back on every call.
  :class:`LrReader` reads a constant LR once and a per-step list once (then indexes it on
  the host); only a ``LearningRateSchedule`` cell still asks the optimizer each step.

Example::

    mem = shared_sampler()        # one thread per process
    peak, current = mem()
    lr = LrReader(optimizer)(step_index)
"""

from __future__ import annotations

import math
import threading
from typing import Any

from ...record.host import process_memory_bytes
from .probes import batch_counts, optimizer_lr, to_float

__all__ = ["MemSampler", "shared_sampler", "LrReader", "BatchCounter"]

# 0.2 s: the writer thread's cadence is 0.5 s (recorder flush_interval_s); a fresher value
# than that is never written sooner.
SAMPLE_INTERVAL_S = 0.2


class MemSampler:
    """Latest (peak RSS, current RSS) bytes, refreshed on a daemon thread."""

    def __init__(self, interval_s: float = SAMPLE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.latest = process_memory_bytes()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepscope-mem", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.latest = process_memory_bytes()
            except Exception:  # never raise into anything; keep the last value
                pass

    def __call__(self) -> tuple[float, float]:
        return self.latest

    def stop(self) -> None:
        self._stop.set()


_SHARED: list[MemSampler] = []
_LOCK = threading.Lock()


def shared_sampler() -> MemSampler:
    """The process's one sampler (memory is per process, not per recorder)."""
    with _LOCK:
        if not _SHARED:
            _SHARED.append(MemSampler())
        return _SHARED[0]


class LrReader:
    """The LR an optimizer applies at a step index, read without a per-step sync when the
    LR is a constant or a per-step list (see module doc)."""

    def __init__(self, optimizer: Any) -> None:
        self.opt = optimizer
        self.const = math.nan
        self.table: Any = None
        lr: Any = getattr(optimizer, "learning_rate", None)
        if optimizer is None or getattr(optimizer, "is_group_lr", False) \
                or not hasattr(lr, "asnumpy"):
            return  # groups or a schedule cell: ask the optimizer (optimizer_lr)
        try:
            if not getattr(optimizer, "dynamic_lr", True):
                self.const = to_float(lr)
            elif len(tuple(lr.shape)) == 1:
                self.table = lr.asnumpy()
        except Exception:  # unusual layouts: fall back to the optimizer's own get_lr()
            self.const, self.table = math.nan, None

    @property
    def asks(self) -> bool:
        """Each read asks the optimizer (a schedule cell): read it before the step, while
        its global step is still the step's."""
        return self.const != self.const and self.table is None

    def __call__(self, step: int) -> float:
        if self.const == self.const:
            return self.const
        if self.table is not None and len(self.table):
            return float(self.table[max(0, min(step, len(self.table) - 1))])
        return optimizer_lr(self.opt)


class BatchCounter:
    """:func:`.probes.batch_counts` of a batch, computed once per first-input shape."""

    def __init__(self, tokens_per_sample: float | None = None) -> None:
        self.tokens_per_sample = tokens_per_sample
        self._cache: dict[tuple[int, ...], tuple[float, float]] = {}

    def __call__(self, batch: Any) -> tuple[float, float]:
        first = batch[0] if isinstance(batch, (tuple, list)) and batch else batch
        try:  # (a MindSpore tensor's shape is a tuple already: hashed as it is)
            got = self._cache.get(first.shape)
        except (AttributeError, TypeError):
            return batch_counts(batch, self.tokens_per_sample)
        if got is None:
            got = self._cache[first.shape] = batch_counts(batch, self.tokens_per_sample)
        return got
