"""The run page's first paint from a sample while a long run's full read is under way.

A run that has nothing cached (no step cache covering its files, not loaded in memory) and
more than ``partial_bytes`` of step files to decode takes seconds to read whole (~5 s a
GB). Rather than wait, the dashboard starts that read in a background thread and answers
the run page's first requests from a sample of the files (``_steps_sample``: evenly spaced
windows, every chart has points across the whole step range), marked ``"partial"`` in both
documents with what was read; the page says so and asks again until the full documents
come, which are the ones it would have got without the sample.

The sheet of a partial document is the run's stored sheet when there is one (the real
numbers, ``Run.known_sheet``), else one summarised from the sample, marked ``"sheet":
"sample"`` (provisional: the page labels it). Partial documents are never kept in the page
cache. A full read that failed is not sampled again: the next request reads and answers the
error.

Example::

    samples = Samples(partial_bytes=64 << 20, sample_bytes=16 << 20)
    got = samples.get("exp1", Run.open("runs/exp1"), start_full)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..analysis.summary import Sheet, summarize
from ..errors import StepscopeError
from ..rundir.run import Run
from ..rundir.steps_cache import uncached_bytes
from ..rundir.steps_sample import sample_step_files
from ..rundir.store import STEPS_DIR, RunDir
from ..schema import RunMeta, StepTable

__all__ = ["Samples", "Partial", "PARTIAL_BYTES", "SAMPLE_BYTES"]

PARTIAL_BYTES = 64 << 20  # step bytes to decode past which the first paint is a sample
SAMPLE_BYTES = 16 << 20  # what the sample reads, over all rank files (~0.1 s to decode)


@dataclass
class Partial:
    """A run's sample: its table, the sheet shown meanwhile and what the page says."""

    signature: Any
    meta: RunMeta
    table: StepTable
    sheet: Sheet
    info: dict[str, Any]


class Samples:
    """Samples of the runs whose full read is under way (thread-safe; see the module)."""

    def __init__(self, partial_bytes: int | None = PARTIAL_BYTES,
                 sample_bytes: int = SAMPLE_BYTES) -> None:
        self.partial_bytes = partial_bytes  # None: never sample
        self.sample_bytes = sample_bytes
        self._lock = threading.Lock()
        self._gates: dict[str, threading.Lock] = {}
        self._held: dict[str, Partial] = {}
        self._filling: set[str] = set()
        self._failed: dict[str, Any] = {}  # rel -> the signature whose full read failed

    def slow(self, run: RunDir) -> bool:
        """Whether a full read of ``run`` would decode more than ``partial_bytes``."""
        if self.partial_bytes is None:
            return False
        cache = run.cache_dir / STEPS_DIR
        todo = 0
        for f in run.step_files():
            todo += uncached_bytes(f, cache)
            if todo > self.partial_bytes:
                return True
        return False

    def get(self, rel: str, run: Run, full: Callable[[], Any]) -> Partial | None:
        """The sample of ``rel`` (made once per state of its files, ``run.key``) with
        ``full()`` (the full read) started in a thread, or None: read it whole (quick, or
        failed before)."""
        signature = run.key
        with self._lock:
            if self._failed.get(rel) == signature:
                return None
            gate = self._gates.setdefault(rel, threading.Lock())
        with gate:
            with self._lock:
                held = self._held.get(rel)
            if held is not None and held.signature == signature:
                return held
            if not self.slow(run.dir):
                return None
            try:  # the sample first: the full read's processes would slow it down
                made = self._make(run, signature)
            except (StepscopeError, OSError, ValueError):
                made = None  # the full read says what is wrong
            if made is None:
                return None
            self._start(rel, signature, full)
            with self._lock:
                self._held[rel] = made
            return made

    def done(self, rel: str) -> None:
        """The full read of ``rel`` is in memory: its sample is not needed any more."""
        with self._lock:
            self._held.pop(rel, None)

    def _start(self, rel: str, signature: Any, full: Callable[[], Any]) -> None:
        with self._lock:
            if rel in self._filling:
                return
            self._filling.add(rel)

        def fill() -> None:
            try:
                full()
            except Exception:  # the next request reads again and answers the error
                with self._lock:
                    self._failed[rel] = signature
            finally:
                with self._lock:
                    self._filling.discard(rel)

        threading.Thread(target=fill, daemon=True, name=f"stepscope-load-{rel}").start()

    def _make(self, run: Run, signature: Any) -> Partial | None:
        meta = run.meta
        sample = sample_step_files(run.dir.step_files(), self.sample_bytes)
        if not sample.records:
            return None
        stored = run.known_sheet()
        if stored is not None:
            sheet, origin = stored, "stored"
        else:
            sheet = summarize(sample.table, meta, conditions=run.conditions)
            origin = "sample"
        info = {"records": sample.records, "estimated_records": sample.estimated_records,
                "bytes_read": sample.bytes_read, "bytes_total": sample.bytes_total,
                "sheet": origin}
        return Partial(signature, meta, sample.table, sheet, info)
