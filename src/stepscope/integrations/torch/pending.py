"""Steps of the zero-code instrumentation: the open step, the finished ones, their emission.

A step's numbers are accumulated in a :class:`StepData` (the :class:`OpenStep`'s
``cur``); at the step boundary the whole step is queued in :class:`PendingSteps` and
:func:`emit` later turns it into a recorder row (device phase times from CUDA event
pairs, blocking communication taken out of the phase it interrupted). A half-finished
step (evaluation after the last optimizer step, a crash) is never written.

On CUDA, rows are emitted one step late: loss, gradient norm, loss scale and the CUDA
events of the communication timer are read once the device has finished them, so that no
host synchronisation is added to any step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ...record.session import StepSession
from . import accum, ddp
from .failures import Failures
from .readers import scalar
from .settings import Settings

# Work between two steps, by kind -> its step-table column (schema.py describes both).
BETWEEN_COLUMNS = {"eval": "eval_s", "checkpoint": "checkpoint_s"}

_NAN = math.nan


@dataclass
class StepData:
    """Everything measured for one optimizer step (seconds, counts, raw values)."""

    t_start: float = _NAN
    t_end: float = _NAN
    wall_end: float = _NAN
    data_wait: float = 0.0
    forward: float = 0.0
    backward: float = 0.0
    optimizer: float = 0.0
    loader_batches: int = 0
    loader_tokens: float = 0.0
    loader_samples: float = 0.0
    fwd_tokens: float = 0.0
    fwd_samples: float = 0.0
    fwd_calls: int = 0  # outermost calls of a module with parameters
    fwd_counted: int = 0  # ... of which token ids were found in the inputs
    micro: int = 0
    losses: list[Any] = field(default_factory=list)
    divisors: list[float | None] = field(default_factory=list)  # per loss: its 1/k (accum)
    accum_k: float | None = None  # the run's confirmed accumulation divisor at this step
    lr: float = _NAN
    grad_norm: Any = None
    loss_scale: Any = None
    overflow: float = _NAN
    mem: tuple[float, float] = (_NAN, _NAN)
    comm: list[Any] = field(default_factory=list)
    compute_end: Any = None
    extra: dict[str, float] = field(default_factory=dict)
    booked: list[list[Any]] = field(default_factory=list)  # between-steps bookings (.between)
    # CUDA only: (phase, start event, end event) and an event at the step's end.
    dev: list[tuple[str, Any, Any]] = field(default_factory=list)
    done_event: Any = None
    tool: float = 0.0  # stepscope's own time inside the step (emission, gathers)


class OpenStep:
    """The step in progress and how many steps closed before it."""

    def __init__(self) -> None:
        self.cur = StepData()
        self.open = False  # training work of the step has started (a recorder exists)
        self.index = 0  # steps closed so far

    def begin(self, now: float) -> None:
        """Training work happened: the step is open (started at ``now`` if not before)."""
        if math.isnan(self.cur.t_start):
            self.cur.t_start = now
        self.open = True

    def finish(self, t_end: float) -> StepData:
        """Close the step at ``t_end`` (its record is returned); the next one starts there."""
        d = self.cur
        self.cur = StepData(t_start=t_end)
        self.open = False
        self.index += 1
        return d


class PendingSteps:
    """Finished steps waiting for their device values, then emitted in order."""

    def __init__(self) -> None:
        self.queue: list[StepData] = []
        self.last_comm: ddp.CommStep | None = None  # of the last step emitted

    def push(self, d: StepData) -> None:
        self.queue.append(d)

    def flush(self, block: bool, session: StepSession | None, settings: Settings,
              saw_loader: bool, failures: Failures) -> None:
        """Emit queued steps whose device values are ready (all of them when ``block``);
        without a ``session`` they are dropped."""
        while self.queue:
            d = self.queue[0]
            ev = d.done_event
            if ev is not None and not ev.query():
                if not block and len(self.queue) <= 2:
                    return  # the device is still on it: read it at a later boundary
                ev.synchronize()  # at most two steps behind, or the run is ending
            self.queue.pop(0)
            if session is None:
                continue
            try:
                self.last_comm = emit(session, settings, d, saw_loader)
            except Exception as exc:
                failures.failed("step emission", exc)


def device_phases(marks: list[tuple[str, Any, Any]]) -> dict[str, float]:
    """Seconds per phase from CUDA event pairs (``elapsed_time`` is in milliseconds)."""
    out: dict[str, float] = {}
    for phase, start, end in marks:
        out[phase] = out.get(phase, 0.0) + float(start.elapsed_time(end)) / 1000.0
    return out


def cross_row(d: StepData, comm: ddp.CommStep, forward: float, backward: float
              ) -> dict[str, float]:
    """This step's values of the cross-rank quantities (:data:`.ddp.CROSS_FIELDS`)."""
    exposed = _NAN if math.isnan(comm.exposed_s) else comm.exposed_s
    return {
        "step_time_s": d.t_end - d.t_start, "data_wait_s": d.data_wait,
        "forward_s": forward, "backward_s": backward, "optimizer_s": d.optimizer,
        "comm_s": comm.total_s, "comm_exposed_s": exposed,
        "compute_s": forward + backward + d.optimizer,
    }


def emit(session: StepSession, settings: Settings, d: StepData, saw_loader: bool
         ) -> ddp.CommStep:
    """Hand one finished step to the session as measured; returns its communication."""
    # The model's own inputs when every outermost call of the step showed token ids
    # (exact: a script that slices targets off the batch feeds fewer tokens than the
    # loader produced, and a loader may prefetch), else the DataLoader batches drawn
    # during the step.
    use_fwd = (d.fwd_counted > 0 and d.fwd_counted == d.fwd_calls) or not d.loader_batches
    tokens = d.fwd_tokens if use_fwd else d.loader_tokens
    samples = d.fwd_samples if use_fwd else d.loader_samples
    if not math.isnan(settings.tokens_per_step):
        tokens = settings.tokens_per_step
    if not math.isnan(settings.samples_per_step):
        samples = settings.samples_per_step
    comm = ddp.summarize_comm(d.comm, d.compute_end)
    exp = comm.exposed_by_phase
    if d.dev:  # CUDA: device time between the phase marks replaces host time
        dev = device_phases(d.dev)
        d.forward = dev.get("forward", d.forward)
        d.backward = dev.get("backward", d.backward)
        d.optimizer = dev.get("optimizer", d.optimizer)
    # Blocking communication inside a phase is comm_exposed_s, not that phase.
    forward = max(0.0, d.forward - exp.get("forward", 0.0))
    backward = max(0.0, d.backward - exp.get("backward", 0.0))
    phases = {"forward": forward, "backward": backward, "optimizer": d.optimizer}
    if d.tool > 0:
        phases["tool"] = d.tool
    if saw_loader:  # without a DataLoader the wait is unknown, not zero
        phases["data_wait"] = d.data_wait
    values = step_values(d, comm, tokens, samples)
    session.record(d.t_start, d.t_end, wall_end_s=d.wall_end,
                   tokens=values.pop("tokens", _NAN), samples=values.pop("samples", _NAN),
                   phases=phases, values=values, cross=cross_row(d, comm, forward, backward))
    return comm


def step_values(d: StepData, comm: ddp.CommStep, tokens: float, samples: float
                ) -> dict[str, float]:
    """The row's values; only what was seen (a NaN here is the training's own NaN)."""
    values: dict[str, float] = {"overflow": d.overflow, "micro_batches": float(d.micro)}
    if tokens > 0:
        values["tokens"] = tokens
    if samples > 0:
        values["samples"] = samples
    if d.losses:
        values["loss"] = accum.step_loss([scalar(x) for x in d.losses], d.divisors,
                                         d.accum_k)
    if d.grad_norm is not None:
        values["grad_norm"] = scalar(d.grad_norm)
    if d.loss_scale is not None:
        values["loss_scale"] = scalar(d.loss_scale)
    for key, v in (("lr", d.lr), ("mem_peak_bytes", d.mem[0]),
                   ("mem_alloc_bytes", d.mem[1])):
        if not math.isnan(v):
            values[key] = v
    if not math.isnan(comm.total_s):
        values["comm_s"] = comm.total_s
        values["comm_exposed_s"] = comm.exposed_s
        for kind, secs in comm.by_kind_s.items():
            values[f"comm_{kind}_s"] = secs
        if comm.buckets:
            values["comm_buckets"] = float(comm.buckets)
            values["comm_buckets_overlapped"] = float(comm.overlapped_buckets)
    for col in BETWEEN_COLUMNS.values():  # measured on every step: 0 = nothing between
        values[col] = 0.0
    values.update(d.extra)
    return values
