"""The recorder's writer side: rows queued by the training thread, written by a thread.

The training thread only appends finished rows (plain lists) to a deque; a background
thread formats them (:func:`~stepscope.record.records.rows_to_records`), appends them to the
rank's step file and then hands each batch of records to the listeners -- the seam the
live rules (stall, slow step, alerts) subscribe to, so they run off the training thread.

Example::

    q = RowQueue(run.steps_path(0), names, rank=0)
    q.add_listener(lambda records: print(len(records), "new rows"))
    q.put(row)            # hot path: one deque append
    q.close()             # joins the thread, writes what is left, calls the listeners
"""

from __future__ import annotations

import threading
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ..rundir.store import StepFileWriter
from .records import rows_to_records

__all__ = ["RowQueue", "Listener"]

# Called with each batch of records just written (dicts as in the step file; a value
# logged after its step closed arrives as a partial record with the same rank and step).
Listener = Callable[[list[dict[str, Any]]], None]


class RowQueue:
    """Hands rows from the training thread to the step file and the listeners."""

    def __init__(self, path: Path, names: Sequence[str], *, rank: int,
                 flush_interval_s: float = 0.5, capacity: int = 8192,
                 background: bool = True) -> None:
        self._file = StepFileWriter(path)
        self._names = names  # the recorder's column list; extras are appended to it
        # deque.append/popleft are atomic, so no lock is taken on the hot path.
        self._rows: deque[list[float]] = deque()
        self._late: list[dict[str, Any]] = []
        self._late_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._listeners: list[Listener] = []
        self._soft_limit = max(16, int(capacity))
        self._wake = threading.Event()
        self._interval = float(flush_interval_s)
        self._closed = False
        # Called (writer thread) with (records dropped so far, first error) when writing
        # works again after a failure (space came back): the loss is recorded at once.
        self.on_recovery: Callable[[int, str | None], None] | None = None
        self._reported = 0
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(target=self._loop, daemon=True,
                                            name=f"stepscope-writer-{rank}")
            self._thread.start()

    def put(self, row: list[float]) -> None:
        """Queue a finished row (training thread)."""
        self._rows.append(row)
        if len(self._rows) > self._soft_limit:  # wake the writer early
            self._wake.set()

    def put_late(self, record: dict[str, Any]) -> None:
        """Queue values logged after their step closed (merged by readers on rank, step)."""
        with self._late_lock:
            self._late.append(record)

    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(records)`` on the writer thread after each batch is written."""
        self._listeners.append(fn)

    @property
    def dropped(self) -> int:
        return self._file.dropped

    @property
    def first_error(self) -> str | None:
        return self._file.first_error

    def _take(self) -> list[dict[str, Any]]:
        q = self._rows
        rows = []
        while True:
            try:
                rows.append(q.popleft())
            except IndexError:
                break
        out = rows_to_records(rows, self._names)
        with self._late_lock:
            late, self._late = self._late, []
        out.extend(late)
        return out

    def flush(self) -> None:
        """Write everything queued so far, then tell the listeners."""
        with self._flush_lock:
            records = self._take()
            if not records:
                return
            written = self._file.write(records)
            if written and self._file.dropped > self._reported:
                self._reported = self._file.dropped
                if self.on_recovery is not None:
                    self.on_recovery(self._reported, self._file.first_error)
            for fn in list(self._listeners):
                try:
                    fn(records)
                except Exception as exc:  # a failing listener must never stop recording
                    self._listeners.remove(fn)
                    warnings.warn(f"stepscope: step listener {fn!r} failed ({exc}); "
                                  "it is no longer called", RuntimeWarning, stacklevel=1)

    def _loop(self) -> None:
        while not self._closed:
            self._wake.wait(self._interval)
            self._wake.clear()
            try:
                self.flush()
            except Exception as exc:  # pragma: no cover - defensive: never kill training
                warnings.warn(f"stepscope: writer error: {exc}", RuntimeWarning, stacklevel=1)

    def close(self) -> None:
        """Stop the thread, write what is left and close the file."""
        if self._closed:
            return
        self._closed = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        self.flush()
        self._file.close()
