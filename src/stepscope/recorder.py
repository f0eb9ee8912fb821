"""Framework-free step recorder: the hot path appends numbers, a thread writes them.

Example::

    import stepscope
    rec = stepscope.Recorder("runs/exp1", meta={"baseline": {"seq_len": 256}})
    for batch in rec.wrap_loader(loader):        # measures time blocked in next()
        with rec.step(tokens=batch.numel(), samples=batch.shape[0]) as s:
            with s.phase("forward"):
                loss = model(batch)
            with s.phase("backward"):
                loss.backward()
            with s.phase("optimizer"):
                opt.step(); opt.zero_grad()
            s.log(loss=float(loss), lr=opt.param_groups[0]["lr"])
    rec.close()

What the times mean
-------------------
* ``step_time_s`` is host wall time from entering ``step()`` to leaving it, plus the data
  wait measured *outside* the step (the ``next(loader)`` before it). On an accelerator the
  host runs ahead of the device, but in steady state the launch queue is full and host step
  time equals device step time (back-pressure); it is exact whenever the step itself
  synchronises (``loss.item()``, an optimizer that reads gradients, a collective).
* Phase times (``forward_s`` ...) are host times unless the step is *synced*: with a ``sync``
  function (e.g. ``torch.cuda.synchronize``) every ``sync_every``-th step calls it at each
  phase boundary, so that step's phase times are device times, at the cost of draining the
  queue on that step only. Rows carry ``synced`` = 1 or 0; breakdowns use synced rows when
  there are any. Plain step timing (no ``phase()`` calls) never synchronises.
* On a CPU there is nothing to synchronise and every phase time is exact.

The clock is injected (``clock``, ``wall_clock``) so tests use exact numbers.
Recording never raises into training: I/O errors are warned about once and counted.
"""

from __future__ import annotations

import atexit
import math
import os
import resource
import threading
import time
import warnings
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from ._records import UNSET, encode_value, rows_to_records
from .conditions import ConditionLog
from .schema import STEP_COLUMN_NAMES, RunMeta
from .store import RunDir, StepFileWriter, is_run_dir, utc_stamp

__all__ = ["Recorder", "Step"]

T = TypeVar("T")
_NAN = math.nan
_UNSET = UNSET  # a slot nothing was recorded in (see _records)
_MAX_EXTRA = 32
_COL = {name: i for i, name in enumerate(STEP_COLUMN_NAMES)}
_I_RANK, _I_STEP = _COL["rank"], _COL["step"]
_I_END, _I_WALL = _COL["end_s"], _COL["wall_time_s"]
_I_STEP_TIME, _I_DATA = _COL["step_time_s"], _COL["data_wait_s"]
_I_TOKENS, _I_SAMPLES, _I_SYNCED = _COL["tokens"], _COL["samples"], _COL["synced"]
_I_CPU, _I_PREEMPT = _COL["cpu_s"], _COL["preempt"]
# Phase names accepted by Step.phase / Recorder.add_time and their columns.
_PHASE_COL = {
    "data": _I_DATA, "data_wait": _I_DATA,
    "forward": _COL["forward_s"], "backward": _COL["backward_s"],
    "optimizer": _COL["optimizer_s"], "comm": _COL["comm_s"],
    "comm_exposed": _COL["comm_exposed_s"], "tool": _COL["tool_s"],
}
_I_TOOL = _COL["tool_s"]


def _env_rank() -> int:
    for var in ("RANK", "RANK_ID", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        value = os.environ.get(var)
        if value is not None and value.strip().isdigit():
            return int(value)
    return 0


class _Phase:
    """Reusable context manager for one phase name (no allocation per step)."""

    __slots__ = ("_rec", "_col", "_t0")

    def __init__(self, rec: Recorder, col: int) -> None:
        self._rec = rec
        self._col = col
        self._t0 = 0.0

    def __enter__(self) -> None:
        rec = self._rec
        if rec._sync_now:
            rec._safe_sync()
        self._t0 = rec._clock()

    def __exit__(self, *exc: object) -> None:
        rec = self._rec
        if rec._sync_now:
            rec._safe_sync()
        dt = rec._clock() - self._t0
        row = rec._row
        v = row[self._col]
        row[self._col] = dt if v == _UNSET else v + dt


class Step:
    """Handle on the open step: ``phase()`` times a phase, ``log()`` attaches values."""

    __slots__ = ("_rec",)

    def __init__(self, rec: Recorder) -> None:
        self._rec = rec

    def phase(self, name: str) -> _Phase:
        p = self._rec._phases.get(name)
        return p if p is not None else self._rec._phase(name)

    def log(self, **values: float) -> None:
        self._rec.log(**values)

    def __enter__(self) -> Step:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._rec.end_step()


class Recorder:
    """Records one row per training step for this rank into ``run_dir``.

    Args:
        run_dir: run directory; created if needed. Rank 0 writes ``run.json``.
        meta: a :class:`RunMeta` or a dict with any of its fields (``baseline``,
            ``environment``, ``config``, ``name``...).
        rank: global rank; default from ``RANK`` / ``RANK_ID`` (MindSpore) env vars, else 0.
        clock: monotonic seconds (injected in tests). ``wall_clock``: epoch seconds.
        usage: returns (process CPU seconds, involuntary context switches), all threads;
            default ``getrusage`` (one system call per step). ``cpu_s`` and ``preempt`` are
            their advance between step ends: wall time that grows without CPU time is
            waiting; with more preemptions it is CPU contention from other processes.
            ``no_usage=True`` disables it.
        sync: device synchronisation function; ``None`` (CPU) never synchronises.
        sync_every: synchronise phase boundaries on every N-th step (N >= 1).
        flush_interval_s: the writer thread flushes at least this often.
        capacity: queued rows that wake the writer before its interval elapses.
        start_step: index given to the first step.
        conditions: sample host/device conditions (``stepscope.conditions``) from the
            writer thread into ``RUN/conditions/``; needs ``background``.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        meta: RunMeta | Mapping[str, Any] | None = None,
        *,
        rank: int | None = None,
        clock: Callable[[], float] = time.perf_counter,
        wall_clock: Callable[[], float] = time.time,
        usage: Callable[[], tuple[float, float]] | None = None,
        sync: Callable[[], None] | None = None,
        sync_every: int = 10,
        flush_interval_s: float = 0.5,
        capacity: int = 8192,
        start_step: int = 0,
        background: bool = True,
        no_usage: bool = False,
        conditions: bool = True,
    ) -> None:
        self.rank = _env_rank() if rank is None else int(rank)
        self._clock = clock
        self._wall = wall_clock
        self._usage = None if no_usage else (usage or _rusage)
        self._usage_last = self._usage() if self._usage is not None else (0.0, 0.0)
        self._sync = sync
        self._sync_every = max(1, int(sync_every))
        self._sync_now = False
        self.run = self._open_run(Path(run_dir), meta)
        self._writer = StepFileWriter(self.run.steps_path(self.rank))
        self._ncols = len(STEP_COLUMN_NAMES) + _MAX_EXTRA
        self._names: list[str] = list(STEP_COLUMN_NAMES)
        self._colmap: dict[str, int] = dict(_COL)  # name -> slot, extras added on first use
        # Closed rows are appended here by the training thread and popped by the writer;
        # deque.append/popleft are atomic, so no lock is taken on the hot path.
        self._queue: deque[list[float]] = deque()
        self._blank = [_UNSET] * self._ncols
        self._row = self._blank.copy()
        self._soft_limit = max(16, int(capacity))
        self.dropped = 0  # records lost to I/O errors (see StepFileWriter)
        self._open = False
        self._t_start = 0.0
        self._t0 = clock()
        self._pending_wait = 0.0
        self._pending_tool = 0.0
        self._next_step = int(start_step)
        self._late: list[dict[str, Any]] = []
        self._late_lock = threading.Lock()
        self._phases: dict[str, _Phase] = {}
        self._handle = Step(self)
        self._closed = False
        self._flush_lock = threading.Lock()
        self._wake = threading.Event()
        self._interval = float(flush_interval_s)
        self._thread: threading.Thread | None = None
        # Host/device conditions (issue 11), sampled by the writer thread only.
        self._conditions = (ConditionLog(self.run.conditions_path(self.rank))
                            if background and conditions else None)
        if background:
            self._thread = threading.Thread(target=self._writer_loop, daemon=True,
                                            name=f"stepscope-writer-{self.rank}")
            self._thread.start()
        _LIVE.add(self)

    # -- set-up ----------------------------------------------------------------------
    def _open_run(self, path: Path, meta: RunMeta | Mapping[str, Any] | None) -> RunDir:
        if isinstance(meta, RunMeta):
            m = meta
        else:
            d = dict(meta or {})
            d.setdefault("run_id", path.name or "run")
            m = RunMeta.from_dict(d)
        if not m.created_utc:
            m.created_utc = utc_stamp()
        if self.rank != 0:
            run = RunDir(path)
            run.steps_path(self.rank).parent.mkdir(parents=True, exist_ok=True)
            return run
        if is_run_dir(path):  # resumed or pre-created (e.g. by `stepscope run`)
            run = RunDir(path)
            try:
                old = run.read_meta()
                for key in ("baseline", "environment", "config"):
                    getattr(old, key).update(getattr(m, key))
                old.status = "running"
                if m.name:
                    old.name = m.name
                run.write_meta(old)
                return run
            except Exception:  # corrupt run.json: start it anew, records are kept
                pass
        return RunDir.create(path, m)

    # -- hot path ----------------------------------------------------------------------
    def step(self, tokens: float = _UNSET, samples: float = _UNSET) -> Step:
        """Open a step; use as ``with rec.step(tokens=..., samples=...) as s:``."""
        self.start_step(tokens, samples)
        return self._handle

    def start_step(self, tokens: float = _UNSET, samples: float = _UNSET) -> None:
        """Functional form of ``step()`` for hooks; pair with ``end_step()``."""
        if self._open:
            self.end_step()
        row = self._row = self._blank.copy()
        row[_I_TOKENS] = tokens
        row[_I_SAMPLES] = samples
        self._sync_now = self._sync is not None and self._next_step % self._sync_every == 0
        self._open = True
        self._t_start = self._clock()

    def end_step(self) -> None:
        """Close the open step and publish its row to the writer thread."""
        if not self._open:
            return
        if self._sync_now:
            self._safe_sync()
        t1 = self._clock()
        row = self._row
        wait = self._pending_wait
        self._pending_wait = 0.0
        row[_I_STEP_TIME] = t1 - self._t_start + wait
        if self._pending_tool:
            tool = self._pending_tool
            self._pending_tool = 0.0
            row[_I_STEP_TIME] += tool
            v = row[_I_TOOL]
            row[_I_TOOL] = tool if v == _UNSET else v + tool
        if wait:
            v = row[_I_DATA]
            row[_I_DATA] = wait if v == _UNSET else v + wait
        row[_I_RANK] = self.rank
        row[_I_STEP] = self._next_step
        row[_I_END] = t1 - self._t0
        row[_I_WALL] = self._wall()
        row[_I_SYNCED] = 1.0 if self._sync_now else 0.0
        if self._usage is not None:
            u = self._usage()
            row[_I_CPU] = u[0] - self._usage_last[0]
            row[_I_PREEMPT] = u[1] - self._usage_last[1]
            self._usage_last = u
        self._sync_now = False
        self._open = False
        self._next_step += 1
        self._queue.append(row)
        if len(self._queue) > self._soft_limit:  # wake the writer early
            self._wake.set()

    def _phase(self, name: str) -> _Phase:
        p = self._phases.get(name)
        if p is None:
            col = _PHASE_COL.get(name)
            if col is None:
                col = self._extra_col(f"{name}_s")
            p = self._phases[name] = _Phase(self, col)
        return p

    def add_time(self, phase: str, seconds: float) -> None:
        """Add a measured duration to a phase of the open step (e.g. from a comm hook).

        Outside a step, ``data``/``data_wait`` and ``tool`` (stepscope's own overhead)
        time counts towards the next step (and its step time, since it happened between
        steps); other phases are ignored.
        """
        if not self._open:
            if phase in ("data", "data_wait"):
                self._pending_wait += seconds
            elif phase == "tool":
                self._pending_tool += seconds
            return
        col = _PHASE_COL.get(phase)
        if col is None:
            col = self._extra_col(f"{phase}_s")
        if col < 0:
            return
        v = self._row[col]
        self._row[col] = seconds if v == _UNSET else v + seconds

    def log(self, **values: float) -> None:
        """Attach values (``loss``, ``lr``, ``grad_norm``, ``mem_peak_bytes``, any metric).

        Inside a step they go to that step; after it they go to the step just closed
        (written as a separate record that readers merge by (rank, step)).
        """
        if self._open:
            row = self._row
            colmap = self._colmap
            for k, v in values.items():
                col = colmap.get(k)
                if col is None:
                    col = self._extra_col(k)
                if col >= 0:
                    row[col] = v  # converted to float by the writer, off the hot path
            return
        if self._next_step == 0:
            return
        rec: dict[str, Any] = {"rank": self.rank, "step": self._next_step - 1}
        for k, v in values.items():
            enc = encode_value(k, v)
            if enc is not None:
                rec[k] = enc
        with self._late_lock:
            self._late.append(rec)

    def _extra_col(self, name: str) -> int:
        col = self._colmap.get(name)
        if col is None:
            if len(self._names) - len(STEP_COLUMN_NAMES) >= _MAX_EXTRA:
                warnings.warn(f"stepscope: more than {_MAX_EXTRA} extra metrics; "
                              f"dropping {name!r}", RuntimeWarning, stacklevel=3)
                self._colmap[name] = -1
                return -1
            col = self._colmap[name] = len(self._names)
            self._names.append(name)
        return col

    def _safe_sync(self) -> None:
        try:
            self._sync()  # type: ignore[misc]
        except Exception:  # a failing sync must never break training
            self._sync = None
            self._sync_now = False

    # -- data loader -------------------------------------------------------------------
    def wrap_loader(self, loader: Iterable[T]) -> Iterator[T]:
        """Iterate ``loader``, adding the time blocked in ``next()`` as data wait."""
        it = iter(loader)
        clock = self._clock
        while True:
            t0 = clock()
            try:
                item = next(it)
            except StopIteration:
                return
            self.add_time("data_wait", clock() - t0)
            yield item

    @property
    def steps_recorded(self) -> int:
        return self._next_step

    @property
    def pending_data_wait(self) -> float:
        """Data wait measured since the last step closed (it goes to the next step)."""
        return self._pending_wait

    def open_value(self, name: str) -> float:
        """A column's value in the open step so far (NaN when unset or no step is open)."""
        col = self._colmap.get(name, -1)
        if not self._open or col < 0 or self._row[col] == _UNSET:
            return _NAN
        return float(self._row[col])

    # -- writer side -------------------------------------------------------------------
    def _take(self) -> list[dict[str, Any]]:
        q = self._queue
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
        """Write everything recorded so far (called by the writer thread and ``close``)."""
        with self._flush_lock:
            records = self._take()
            if records:
                self._writer.write(records)

    def _writer_loop(self) -> None:
        while not self._closed:
            self._wake.wait(self._interval)
            self._wake.clear()
            try:
                self.flush()
                if self._conditions is not None:
                    self._conditions.tick()
            except Exception as exc:  # pragma: no cover - defensive: never kill training
                warnings.warn(f"stepscope: writer error: {exc}", RuntimeWarning, stacklevel=1)

    def close(self, status: str = "finished", error: str | None = None) -> None:
        """Flush, stop the writer and (rank 0) mark run.json ``finished`` or ``failed``."""
        if self._closed:
            return
        self.end_step()
        self._closed = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        if self._conditions is not None:
            self._conditions.close()
        self.flush()
        self._writer.close()
        if self._writer.dropped:
            self.dropped += self._writer.dropped
        if self.rank == 0:
            try:
                self.run.update_meta(status=status, error=error,
                                     config={"records_dropped": self.dropped})
            except Exception as exc:
                warnings.warn(f"stepscope: cannot update run.json: {exc}", RuntimeWarning,
                              stacklevel=2)
        _LIVE.discard(self)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        if et is None or issubclass(et, (KeyboardInterrupt, SystemExit)) and not e:
            self.close()
        else:
            self.close(status="failed", error=f"{et.__name__}: {e}")


def _rusage() -> tuple[float, float]:
    """(CPU seconds, involuntary context switches) of this process, all threads."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime, float(r.ru_nivcsw)


_LIVE: weakref.WeakSet[Recorder] = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for rec in list(_LIVE):
        try:
            rec.close()
        except Exception:
            pass
