"""The per-step core every adapter feeds plain numbers: one :class:`StepSession` per rank.

A session wraps a :class:`~stepscope.record.recorder.Recorder` and does, per step, what every
framework needs: the "is a loss being recorded" check, a memory sample, the low-frequency
cross-rank window and gather, profiler-capture hooks, and the accounting of stepscope's own
time (``tool_s``). It imports no framework: adapters read framework state and hand over
numbers, the all-gather and the capture object are injected.

Two ways in, one row format:

* **measured** (the zero-code torch hooks, which time everything themselves)::

      s.record(start_s, end_s, tokens=4096, phases={"forward": 0.2, "backward": 0.4},
               values={"lr": 1e-3}, loss=2.3)

* **events** (callbacks that see "step begins", "forward ends", ...; loops)::

      s.begin()                 # data wait = time since the previous step ended
      s.mark(); ...; s.lap("forward")
      with s.phase("optimizer"):
          opt.step()
      s.end(values={"lr": 1e-3}, loss=2.3)

Time is read only from the injected ``clock`` (``perf_counter`` seconds, the recorder's
clock); tests drive it with exact numbers. Live rules subscribe to the completed rows with
:meth:`StepSession.subscribe`; they run on the writer thread, never on the training thread.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar

from ..schema import BETWEEN_STEP_COLUMNS
from .crossrank import EventBuilder, FileExchange, Rows, WindowStats, cross_rank_event
from .losscheck import LossWatch
from .recorder import Recorder, timed_iter
from .records import UNSET
from .writer import Listener

__all__ = ["StepSession", "Capture", "CROSS_RANK_NAMES", "CrossVector", "Exchange", "MemProbe"]

T = TypeVar("T")
_NAN = math.nan
# Per-rank quantities gathered by default; stragglers are scored on compute_s (step time
# without the data wait and the timed communication, where a fast rank waits for a slow one).
CROSS_RANK_NAMES: tuple[str, ...] = ("step_time_s", "data_wait_s", "compute_s")
# This rank's published vector from its window medians (an adapter may append fields).
CrossVector = Callable[[list[float]], Sequence[float]]
# (step, vector) -> the latest merged view; default a FileExchange (no collective).
Exchange = Callable[[int, Sequence[float]], Mapping[str, Any] | None]
MemProbe = Callable[[], tuple[float, float]]


class Capture(Protocol):
    """Profiler capture hooks (e.g. ``integrations.mindspore.profile.ProfileCapture``)."""

    def before_step(self, step: int) -> None: ...

    def after_step(self, step: int) -> None: ...

    def active(self, step: int) -> bool: ...

    def close(self) -> None: ...


class _CrossRank:
    """This rank's window of recent steps and the exchange that compares it across ranks."""

    def __init__(self, exchange: Exchange, vector: CrossVector, every: int,
                 names: Sequence[str], window: int) -> None:
        self.exchange, self.vector, self.every = exchange, vector, int(every)
        self.names = tuple(names)
        self.window = WindowStats(self.names, window=window)
        self.done = -1  # completed-step count of the last exchange

    def due(self, completed: int) -> bool:
        return bool(self.every) and completed > 0 and completed % self.every == 0 \
            and completed != self.done


class StepSession:
    """Recorder + loss check + memory + cross-rank window + capture + tool time, per step.

    Args:
        rec: the rank's recorder (its ``rank`` is the session's).
        loss_source: what the loss is read from, for the "no loss recorded" finding;
            empty disables the check. ``loss_advice``: that finding's recommendation in
            the adapter's terms.
        capture: profiler capture hooks, called around the steps they choose.
        mem_probe: returns (peak bytes, bytes in use); sampled at each step's end unless
            the adapter passes ``mem_peak_bytes`` itself.
        clock: the recorder's clock (``perf_counter`` seconds).
        sync: device synchronisation (e.g. ``mindspore.runtime.synchronize``); with
            ``sync_every`` = N > 0, the event form calls it at every phase boundary of each
            N-th step (and at the end of the step before it, so that step starts with an
            empty queue) and marks those rows ``synced``. On asynchronous execution an
            unsynced phase time is where the host waited, not where the device worked.
    """

    def __init__(self, rec: Recorder, *, loss_source: str = "", capture: Capture | None = None,
                 mem_probe: MemProbe | None = None,
                 clock: Callable[[], float] = time.perf_counter,
                 sync: Callable[[], None] | None = None, sync_every: int = 0,
                 loss_advice: str = "") -> None:
        self.rec, self.rank = rec, rec.rank
        self.sync = sync if sync_every > 0 else None
        self.sync_every = max(0, int(sync_every))
        self._sync_now = False
        self.watch = LossWatch(loss_source, loss_advice) if loss_source else None
        self.capture, self.mem_probe, self.clock = capture, mem_probe, clock
        self.cross: _CrossRank | None = None
        self.gather_after_step = True  # False: the adapter calls cross_rank() in a step
        self._loader_wait = 0.0
        self._tool_s, self._tool_t0 = 0.0, _NAN  # own time since the last row, and its start
        self._prev_end = clock()
        self._between: dict[str, float] = {}  # eval_s / checkpoint_s since the last row
        self.in_step = False
        self._start = self._mark = 0.0
        self._phases: dict[str, float] = {}
        self._tokens = self._samples = _NAN
        self._values: dict[str, float] = {}

    @property
    def step(self) -> int:
        """Index of the step being recorded next (= steps recorded so far)."""
        return self.rec.steps_recorded

    def subscribe(self, fn: Listener) -> None:
        """Call ``fn(records)`` with each batch of completed rows, on the writer thread."""
        self.rec.add_listener(fn)

    # -- measured form ---------------------------------------------------------------------
    def record(self, start_s: float, end_s: float, *, wall_end_s: float | None = None,
               tokens: float = _NAN, samples: float = _NAN,
               phases: Mapping[str, float] | None = None,
               values: Mapping[str, float] | None = None, loss: float | None = None,
               missing_loss: str = "", cross: Mapping[str, float] | None = None,
               synced: bool = False) -> int:
        """Record one measured step, then run the after-step work; returns its index.

        ``loss``: None when no loss was seen (``missing_loss`` says what was seen
        instead). ``cross``: this step's values of the cross-rank quantities (default:
        step time, data wait, and compute = step time - data wait - ``comm_s``).
        stepscope's own time since the previous row goes to ``tool_s``; when it ran
        before ``start_s`` (between steps) the step is extended to cover it.
        """
        step = self.step
        vals = dict(values or {})
        self._check_loss(step, loss, missing_loss)
        if loss is not None:
            vals["loss"] = loss
        if self.capture is not None and self.capture.active(step):
            vals["profiled"] = 1.0  # kept out of the steady state (summary.steady_mask)
        if self.mem_probe is not None and "mem_peak_bytes" not in vals:
            vals["mem_peak_bytes"], vals["mem_alloc_bytes"] = self.mem_probe()
        ph = dict(phases or {})
        if self._tool_s:
            ph["tool"] = ph.get("tool", 0.0) + self._tool_s
            if self._tool_t0 < start_s:  # it ran between steps: the step covers it
                start_s -= min(self._tool_s, start_s - self._tool_t0)
            self._tool_s, self._tool_t0 = 0.0, _NAN
        self.rec.record_step(start_s, end_s, wall_end_s=wall_end_s, tokens=_num(tokens),
                             samples=_num(samples), phases=ph, values=vals, synced=synced)
        self._prev_end = end_s
        self._after(step, end_s - start_s, ph, vals, cross)
        return step

    def _check_loss(self, step: int, loss: float | None, missing: str) -> None:
        if self.watch is None or (loss is None and not missing):
            return  # no check asked for, or a failed step (nothing to say about it)
        finding = self.watch.observe(step, loss, missing)
        if finding is not None:
            finding.rank = self.rank
            self.rec.run.append_event({"type": "finding", **finding.to_dict()})

    def _after(self, step: int, step_time: float, phases: Mapping[str, float],
               values: Mapping[str, float], cross: Mapping[str, float] | None) -> None:
        c, cap = self.cross, self.capture
        own_work = cap is not None or (c is not None and self.gather_after_step)
        t0 = self.clock() if own_work else _NAN
        if cap is not None:
            cap.after_step(step)  # may stop the profiler (~1 s on CPU)
        if c is not None and (cap is None or not cap.active(step)):
            if cross is None:  # (a profiled step's times are distorted: kept out)
                wait = phases.get("data_wait", phases.get("data", 0.0))
                comm = phases.get("comm", values.get("comm_s", 0.0))  # a timed phase or a value
                cross = {"step_time_s": step_time, "data_wait_s": wait,
                         "compute_s": step_time - wait - (0.0 if comm != comm else comm)}
            c.window.add(**cross)
        if c is not None and self.gather_after_step:
            self.cross_rank()
        if t0 == t0:  # some work of our own ran: bill it, and wait from after it
            self.own_time(t0)
            self._prev_end = self.clock()

    def own_time(self, t0: float) -> None:
        """stepscope's own time from ``t0`` (this session's clock) to now: billed to the next
        row as tool_s, out of its data wait (adapters' own passes call it)."""
        dt = self.clock() - t0
        if dt > 0:
            if math.isnan(self._tool_t0):
                self._tool_t0 = t0
            self._tool_s += dt

    # -- cross-rank ------------------------------------------------------------------------
    def enable_cross_rank(self, vector: CrossVector | None = None, *, world: int, every: int,
                          names: Sequence[str] = CROSS_RANK_NAMES, window: int = 50,
                          event: EventBuilder | None = None, aligned_only: Sequence[str] = (),
                          exchange: Exchange | None = None) -> None:
        """Compare ranks every ``every`` steps, without a collective.

        Each rank publishes ``vector(medians)`` of its window to the run directory and
        goes on (:class:`~stepscope.record.crossrank.FileExchange`); rank 0
        merges the ranks' latest windows on a thread into a ``cross_rank`` event built by
        ``event(step, rows)`` (default: medians, straggler scores on ``compute_s``). Ranks
        at different step counts (uneven inputs) therefore never wait for each other.
        Nothing is exchanged with one rank or ``every`` = 0.
        """
        if world < 2 or every <= 0:
            return
        names = tuple(names)

        def default_event(step: int, rows: Rows) -> dict[str, Any]:
            return cross_rank_event(step, names, rows, "compute_s")

        # A rank more than 3 rounds away is compared no more (it is named stale instead).
        ex = exchange or FileExchange(self.rec.run, self.rank, world, event or default_event,
                                      max_lag_steps=3 * every, aligned_only=aligned_only)
        self.cross = _CrossRank(ex, vector or list, every, names, window)

    def cross_rank(self) -> float:
        """Exchange now if due; returns the seconds it took (stepscope's own time).

        Every rank logs its own straggler score (and wait/transfer split when the view
        has one) from the latest merged view on the step just recorded.
        """
        c, completed = self.cross, self.step
        if c is None or not c.due(completed):
            return 0.0
        c.done = completed
        t0 = self.clock()
        try:
            view = c.exchange(completed - 1, list(c.vector(c.window.medians())))
        except Exception as exc:  # a failing exchange must not stop training: say so once
            self.cross = None
            self.rec.run.append_event({"type": "warning", "rank": self.rank,
                                       "message": f"cross-rank view disabled: {exc}"})
            return self.clock() - t0
        me = str(self.rank)
        mine = {k: _lookup(view, f, me) for k, f in (
            ("straggler_score", "straggler_scores"), ("comm_wait_s", "comm_wait_s"),
            ("comm_transfer_s", "comm_transfer_s"))}
        self.rec.log(**{k: v for k, v in mine.items() if not math.isnan(v)})
        return self.clock() - t0

    # -- event form ------------------------------------------------------------------------
    def wrap_loader(self, loader: Iterable[T]) -> Iterator[T]:
        """Iterate ``loader``, keeping the time blocked in ``next()`` (see
        :attr:`loader_wait_s`)."""
        return timed_iter(loader, self.clock, self._add_loader_wait)

    def _add_loader_wait(self, seconds: float) -> None:
        self._loader_wait += seconds

    @property
    def loader_wait_s(self) -> float:
        """Time blocked in :meth:`wrap_loader` since the last :meth:`begin`."""
        return self._loader_wait

    def restart_wait(self) -> None:
        """Data wait of the next step counts from now (e.g. a new epoch begins)."""
        self._prev_end = self.clock()

    def between_steps(self, column: str, seconds: float) -> None:
        """Work since the last step that is neither data wait nor training (an evaluation,
        a checkpoint save; ``column`` is ``eval_s`` or ``checkpoint_s``), measured by the
        caller: booked on the next step's ``column`` and left out of its data wait and
        span (a callback's data wait is otherwise all the time since the last step)."""
        if column in BETWEEN_STEP_COLUMNS and math.isfinite(seconds) and seconds > 0:
            self._between[column] = self._between.get(column, 0.0) + seconds

    def begin(self, wait_s: float | None = None) -> None:
        """Open a step now. Its data wait is ``wait_s`` when given (e.g. time blocked in
        the loader), else the time since the previous step ended (a callback's view),
        less what :meth:`between_steps` booked."""
        if self.in_step:
            return
        self._sync_now = self.sync is not None and self.step % self.sync_every == 0
        if self._sync_now and self.step == 0:
            self._safe_sync()  # later synced steps were drained by the step before
        now = self.clock()
        between, self._between = self._between, {}
        if wait_s is None:
            wait = now - self._prev_end
            taken = min(sum(between.values()), wait)
            wait -= taken
            # (never more than the gap: a longer report is scaled to what fits in it)
            scale = taken / sum(between.values()) if between else 1.0
            between = {k: v * scale for k, v in between.items()}
        else:
            wait = wait_s
        self._loader_wait = 0.0
        self._start = now - wait
        self._phases = {"data_wait": wait}
        self._tokens = self._samples = _NAN
        self._values = dict(between)
        self.in_step = True
        if self.capture is not None:
            self.capture.before_step(self.step)  # may start the profiler: own time, in
            self.own_time(now)  # this step (its tool_s), not in its data wait
        self._mark = self.clock()

    def _safe_sync(self) -> None:
        try:
            assert self.sync is not None
            self.sync()
        except Exception as exc:  # a failing sync must not stop training: stop syncing
            self.sync, self._sync_now = None, False
            self.rec.run.append_event({"type": "warning", "rank": self.rank,
                                       "message": f"device sync disabled: {exc}"})

    def mark(self) -> None:
        """A phase starts now (see :meth:`lap`)."""
        if self._sync_now:
            self._safe_sync()
        self._mark = self.clock()

    def lap(self, phase: str) -> None:
        """The phase begun at the last mark (or lap) ends now."""
        if self._sync_now:
            self._safe_sync()
        now = self.clock()
        if self.in_step:
            self.add_time(phase, now - self._mark)
        self._mark = now

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name`` (``forward``, ``optimizer``, any name)."""
        self.mark()
        try:
            yield
        finally:
            self.lap(name)

    def add_time(self, phase: str, seconds: float) -> None:
        """Add measured seconds to a phase of the open step (``data_wait`` included)."""
        if self.in_step:
            self._phases[phase] = self._phases.get(phase, 0.0) + seconds

    def count(self, tokens: float, samples: float) -> None:
        """Add a micro-batch's tokens and samples (NaN: not known) to the open step."""
        if not math.isnan(tokens):
            self._tokens = tokens if math.isnan(self._tokens) else self._tokens + tokens
        if not math.isnan(samples):
            self._samples = samples if math.isnan(self._samples) else self._samples + samples

    def log(self, **values: float | None) -> None:
        """Values of the open step (``None``: not seen); after it, of the step just closed."""
        clean = {k: v for k, v in values.items() if v is not None}
        if self.in_step:
            self._values.update(clean)
        else:
            self.rec.log(**clean)

    def end(self, *, values: Mapping[str, float | None] | None = None,
            loss: float | None = None, missing_loss: str = "") -> int:
        """Close the open step now and record it (see :meth:`record`); -1 if none is open."""
        if not self.in_step:
            return -1
        synced = self._sync_now
        if self.sync is not None and (synced or (self.step + 1) % self.sync_every == 0):
            self._safe_sync()  # this step's phases, or the next step starts drained
        now = self.clock()
        self.in_step = self._sync_now = False
        vals = {**self._values, **{k: v for k, v in (values or {}).items() if v is not None}}
        return self.record(self._start, now, tokens=self._tokens, samples=self._samples,
                           phases=self._phases, values=vals, loss=loss,
                           missing_loss=missing_loss, synced=synced and self.sync is not None)

    def close(self, status: str = "finished", error: str | None = None) -> None:
        if self.capture is not None:
            self.capture.close()
        join = getattr(self.cross.exchange, "join", None) if self.cross else None
        if join is not None:
            join()  # rank 0's last merge (bounded) before the records close
        self.rec.close(status=status, error=error)

    def summary(self) -> dict[str, Any]:
        w = self.watch
        return {"steps_with_loss": w.with_loss if w else 0,
                "steps_without_loss": w.without_loss if w else 0}


def _lookup(view: Mapping[str, Any] | None, field: str, rank: str) -> float:
    """``view[field][rank]`` as a float, NaN when absent."""
    v = (view or {}).get(field)
    v = v.get(rank) if isinstance(v, Mapping) else None
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else _NAN


def _num(v: float) -> float:
    """NaN counts as not recorded for tokens and samples (the recorder's UNSET)."""
    return v if v == v else UNSET
