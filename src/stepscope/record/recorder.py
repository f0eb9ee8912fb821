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

A step measured elsewhere (a framework's own timers, hooks) is handed over as numbers::

    rec.record_step(t_start, t_end, tokens=4096, phases={"forward": 0.21, "backward": 0.40},
                    values={"loss": 2.31, "lr": 3e-4})

Both paths build the same row; :class:`stepscope.record.session.StepSession` adds what every
adapter needs around it (loss check, memory, cross-rank view, profiler capture).

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
import socket
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from ..plugs import start_plugs
from ..rundir.store import RunDir, utc_stamp
from ..schema import STEP_COLUMN_NAMES, RunMeta
from .conditions import ConditionLog
from .rank import resolve_rank
from .records import UNSET, RowLayout, encode_value
from .writer import Listener, RowQueue

__all__ = ["Recorder", "Step"]

T = TypeVar("T")
_NAN = math.nan
_UNSET = UNSET  # a slot nothing was recorded in (see _records)
_COL = {name: i for i, name in enumerate(STEP_COLUMN_NAMES)}
_I_RANK, _I_STEP = _COL["rank"], _COL["step"]
_I_END, _I_WALL = _COL["end_s"], _COL["wall_time_s"]
_I_STEP_TIME, _I_DATA = _COL["step_time_s"], _COL["data_wait_s"]
_I_TOKENS, _I_SAMPLES, _I_SYNCED = _COL["tokens"], _COL["samples"], _COL["synced"]
_I_CPU, _I_PREEMPT, _I_TOOL = _COL["cpu_s"], _COL["preempt"], _COL["tool_s"]


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
        conditions: sample host/device conditions (``stepscope.record.conditions``) on the writer
            thread into ``RUN/conditions/``; needs ``background``.
        alerts: an alert file (TOML; see ``stepscope.alerts``): live rules on the writer
            thread, a stall watchdog, chat webhooks. Default ``$STEPSCOPE_ALERTS``.
        metrics_port: serve Prometheus ``/metrics`` on this port + local rank.
            Default ``$STEPSCOPE_METRICS_PORT``; off when neither is set.
        plugs: more plugs to start by name, registered or installed (the
            ``stepscope.plugs`` entry points); ``$STEPSCOPE_PLUGS`` adds to them. Alerts,
            metrics and the live export are plugs too (see ``stepscope.plugs``).
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
        alerts: str | os.PathLike[str] | None = None,
        metrics_port: int | None = None,
        plugs: Sequence[str] = (),
    ) -> None:
        self.rank = resolve_rank() if rank is None else int(rank)
        self._clock = clock
        self._wall = wall_clock
        self._usage = None if no_usage else (usage or _rusage)
        self._usage_last = self._usage() if self._usage is not None else (0.0, 0.0)
        self._sync = sync
        self._sync_every = max(1, int(sync_every))
        self._sync_now = False
        self.run = RunDir.for_recorder(Path(run_dir), _as_meta(Path(run_dir), meta), self.rank)
        self._layout = RowLayout()  # column -> slot; extras added on first use
        # A file of this process's own, even if another process resolved the same rank.
        self._queue = RowQueue(self.run.claim_steps_path(self.rank), self._layout.names,
                               rank=self.rank, flush_interval_s=flush_interval_s,
                               capacity=capacity, background=background)
        self._queue.on_recovery = lambda n, first: self.run.report_loss(self.rank, n, first)
        # Host/device conditions (contention, throttling), sampled on the writer thread at flush
        # cadence.
        self._conditions = (ConditionLog(self.run.conditions_path(self.rank))
                            if background and conditions else None)
        if self._conditions is not None:
            self._queue.add_listener(self._conditions.on_records)
        self._blank = self._layout.blank
        self._row = self._blank.copy()
        self.dropped = 0  # records lost to I/O errors (see StepFileWriter)
        self._open = False
        self._t_start = 0.0
        self._t0 = clock()
        self._pending_wait = 0.0
        self._pending_tool = 0.0
        self._next_step = int(start_step)
        self._phases: dict[str, _Phase] = {}
        self._handle = Step(self)
        self._closed = False
        # Lets `stepscope watch` tell a killed process from a slow one.
        self.run.append_event({"type": "process", "rank": self.rank, "pid": os.getpid(),
                               "hostname": socket.gethostname()})
        self._plugs = start_plugs(self, alerts=alerts, metrics_port=metrics_port,
                                  names=plugs)
        _LIVE.add(self)

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
        synced = self._sync_now
        if synced:
            self._safe_sync()
        t1 = self._clock()
        self._sync_now = False
        self._open = False
        self._publish(self._row, t1 - self._t_start, t1, self._wall(), synced)

    def record_step(self, start_s: float, end_s: float, *, wall_end_s: float | None = None,
                    tokens: float = _UNSET, samples: float = _UNSET,
                    phases: Mapping[str, float] | None = None,
                    values: Mapping[str, float] | None = None, synced: bool = False) -> int:
        """Record a step that is already measured; returns its index.

        ``start_s``/``end_s``: the step's bounds on this recorder's clock (``perf_counter``
        seconds by default); ``step_time_s`` is their difference. ``wall_end_s``: epoch
        seconds at the end (default: read now). ``phases``: seconds per phase (``data``,
        ``forward``, ``backward``, ``optimizer``, ``comm``, ``comm_exposed``, ``tool``; any
        other name becomes ``<name>_s``). ``values``: ``loss``, ``lr``, any metric; a value
        that is not a number is not recorded, a NaN follows the rules of ``log``.
        ``synced``: the phase times are device times. As with ``step()``, data wait and
        stepscope's own time given to ``add_time`` outside a step count in this step.

        Example::

            rec.record_step(10.0, 10.5, tokens=4096, phases={"forward": 0.2},
                            values={"loss": 2.3})
        """
        if self._open:
            self.end_step()
        row = self._blank.copy()
        row[_I_TOKENS] = tokens
        row[_I_SAMPLES] = samples
        if phases:
            self._layout.add_phases(row, phases)
        if values:
            self._layout.set_values(row, values)
        return self._publish(row, end_s - start_s, end_s,
                             self._wall() if wall_end_s is None else wall_end_s, synced)

    def _publish(self, row: list[float], step_time: float, t_end: float, wall: float,
                 synced: bool) -> int:
        """Fill the row's bookkeeping columns and queue it (both recording paths)."""
        wait, tool = self._pending_wait, self._pending_tool
        if wait or tool:  # measured between steps: it belongs to this one
            self._pending_wait = self._pending_tool = 0.0
            step_time += wait + tool
            for col, extra in ((_I_DATA, wait), (_I_TOOL, tool)):
                if extra:
                    v = row[col]
                    row[col] = extra if v == _UNSET else v + extra
        step = self._next_step
        row[_I_STEP_TIME] = step_time
        row[_I_RANK] = self.rank
        row[_I_STEP] = step
        row[_I_END] = t_end - self._t0
        row[_I_WALL] = wall
        row[_I_SYNCED] = 1.0 if synced else 0.0
        if self._usage is not None:
            u = self._usage()
            row[_I_CPU] = u[0] - self._usage_last[0]
            row[_I_PREEMPT] = u[1] - self._usage_last[1]
            self._usage_last = u
        self._next_step = step + 1
        self._queue.put(row)
        return step

    def _phase(self, name: str) -> _Phase:
        p = self._phases.get(name)
        if p is None:
            p = self._phases[name] = _Phase(self, self._layout.phase_slot(name))
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
        col = self._layout.phase_slot(phase)
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
            self._layout.set_values(self._row, values)
            return
        if self._next_step == 0:
            return
        rec: dict[str, Any] = {"rank": self.rank, "step": self._next_step - 1}
        for k, v in values.items():
            enc = encode_value(k, v)
            if enc is not None:
                rec[k] = enc
        self._queue.put_late(rec)

    def _safe_sync(self) -> None:
        try:
            self._sync()  # type: ignore[misc]
        except Exception:  # a failing sync must never break training
            self._sync = None
            self._sync_now = False

    # -- data loader -------------------------------------------------------------------
    def wrap_loader(self, loader: Iterable[T]) -> Iterator[T]:
        """Iterate ``loader``, adding the time blocked in ``next()`` as data wait."""
        return timed_iter(loader, self._clock, lambda s: self.add_time("data_wait", s))

    @property
    def steps_recorded(self) -> int:
        return self._next_step

    # -- writer side -------------------------------------------------------------------
    def add_listener(self, fn: Listener) -> None:
        """Call ``fn(records)`` with each batch of step records, on the writer thread.

        The seam for live rules: they see every row as written, never on the training
        thread. A listener that raises is warned about once and no longer called.
        """
        self._queue.add_listener(fn)

    def flush(self) -> None:
        """Write everything recorded so far (called by the writer thread and ``close``)."""
        self._queue.flush()

    def close(self, status: str = "finished", error: str | None = None) -> None:
        """Flush, stop the writer and (rank 0) mark run.json ``finished`` or ``failed``."""
        if self._closed:
            return
        self.end_step()
        self._closed = True
        self._queue.close()
        if self._conditions is not None:
            self._conditions.close()
        self.dropped += self._queue.dropped
        if self._queue.dropped:
            self.run.report_loss(self.rank, self.dropped, self._queue.first_error)
        self._plugs.close(status)  # after the last records went through them
        if self.rank == 0:
            try:
                self.run.finish(status, error, self.dropped, self._queue.first_error)
            except Exception as exc:
                warnings.warn(f"stepscope: cannot update run.json: {exc}", RuntimeWarning,
                              stacklevel=2)
        _LIVE.discard(self)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        status, error = _exit_outcome(et, e)
        self.close(status=status, error=error)


def _exit_outcome(et: type[BaseException] | None, e: BaseException | None
                 ) -> tuple[str, str | None]:
    """run.json's (status, error) for leaving a ``with Recorder`` block this way.

    The rule: ``finished`` exactly when the process would exit with status 0 from it, so
    run.json agrees with the launcher (which marks a non-zero exit ``failed``). So
    ``sys.exit()``, ``sys.exit(0)`` and ``SystemExit(None)`` finish; ``sys.exit(3)`` fails
    with ``SystemExit: 3``; a KeyboardInterrupt fails (Python exits 130 from it: the run
    was stopped, not completed, as with SIGTERM), as does any other exception.
    """
    if et is None:
        return "finished", None
    if isinstance(e, SystemExit) and (e.code is None or
                                      isinstance(e.code, int) and e.code == 0):
        return "finished", None
    text = str(e) if e is not None else ""
    return "failed", f"{et.__name__}: {text}" if text else et.__name__


def _as_meta(path: Path, meta: RunMeta | Mapping[str, Any] | None) -> RunMeta:
    if isinstance(meta, RunMeta):
        m = meta
    else:
        d = dict(meta or {})
        d.setdefault("run_id", path.name or "run")
        m = RunMeta.from_dict(d)
    if not m.created_utc:
        m.created_utc = utc_stamp()
    return m


def timed_iter(loader: Iterable[T], clock: Callable[[], float],
               on_wait: Callable[[float], None]) -> Iterator[T]:
    """Iterate ``loader``, handing ``on_wait`` the seconds each ``next()`` blocked."""
    it = iter(loader)
    while True:
        t0 = clock()
        try:
            item = next(it)
        except StopIteration:
            return
        on_wait(clock() - t0)
        yield item


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
