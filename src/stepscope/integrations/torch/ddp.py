"""Communication timing for torch.distributed: DDP buckets, FSDP2 collectives, cross-rank view.

Three pieces, all fed to :mod:`stepscope.integrations.torch.auto` (``stepscope run``):

* :class:`CommTimer` collects the ``[launch, done]`` interval of every collective in the
  current step. Intervals come from a DDP comm hook (:func:`timed_comm_hook`, one interval
  per gradient bucket) and from wrappers around the ``torch.distributed`` collectives that
  FSDP2 (``fully_shard``) and hand-written code call (:func:`patch_collectives`).
  On CPU/gloo the marks are host clock readings taken when a collective is launched and
  when its future completes. On CUDA they are CUDA events recorded on the current stream
  (no host synchronisation); they are resolved one step later, when the events are done.
* Pure functions over those intervals: :func:`union_s` (communication wall time),
  :func:`exposed_after` (time not hidden behind backward compute) and
  :func:`wait_transfer` (how much of a bucket's time was waiting for the slowest rank).
* Cross-rank view: every N steps each rank publishes its medians and bucket marks
  (:func:`cross_vector`) through the run directory, never a collective (the core's
  session and ``stepscope.record.crossrank.FileExchange``); :func:`cross_rank_summary` scores them
  with the framework-free ``stepscope.record.crossrank`` (same ``cross_rank`` event as the
  MindSpore adapter) and adds the DDP wait/transfer split.

Example::

    timer = CommTimer(clock=time.perf_counter)
    hook = timed_comm_hook(timer)            # what ddp.register_comm_hook receives
    ...
    step = timer.take()                      # CommStep for the step just finished
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...record.crossrank import Rows, as_rows, cross_rank_event

__all__ = [
    "CommStep",
    "CommTimer",
    "ALIGNED_ONLY",
    "cross_vector",
    "exposed_after",
    "patch_collectives",
    "timed_comm_hook",
    "union_s",
    "wait_transfer",
]

# Collectives wrapped in the ``torch.distributed`` namespace, with the column they feed.
# FSDP2 calls ``dist.all_gather_single`` / ``dist.reduce_scatter_single`` (torch 2.13,
# fsdp/_fully_shard/_fsdp_collectives.py); older code calls the ``*_tensor`` forms.
COLLECTIVES: dict[str, str] = {
    "all_reduce": "allreduce",
    "all_gather": "allgather",
    "all_gather_single": "allgather",
    "all_gather_into_tensor": "allgather",
    "reduce_scatter": "reducescatter",
    "reduce_scatter_single": "reducescatter",
    "reduce_scatter_tensor": "reducescatter",
    "all_to_all_single": "alltoall",
    "broadcast": "broadcast",
}
# Most buckets kept per step for the cross-rank wait/transfer split (DDP's default 25 MB
# buckets give a few dozen buckets even for multi-billion-parameter models).
MAX_BUCKETS = 64
# Fields of the cross_rank event that compare one step across ranks (bucket marks of one
# step): kept only when every rank's vector is of the same step.
ALIGNED_ONLY: tuple[str, ...] = ("comm_wait_s", "comm_transfer_s", "comm_split")


# -- pure functions over intervals --------------------------------------------------------
def union_s(intervals: Sequence[tuple[float, float]]) -> float:
    """Length of the union of ``[start, end]`` intervals (overlapping buckets count once).

    >>> union_s([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)])
    4.0
    """
    total = 0.0
    cur_s = cur_e = -math.inf
    for s, e in sorted(intervals):
        if s > cur_e:
            total += max(0.0, cur_e - cur_s) if cur_e > -math.inf else 0.0
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e > -math.inf:
        total += max(0.0, cur_e - cur_s)
    return total


def exposed_after(intervals: Sequence[tuple[float, float]], compute_end: float) -> float:
    """Communication time after ``compute_end`` (not hidden behind compute).

    For DDP the backward pass's compute ends when the last bucket is launched (its
    gradients are the last ones produced); everything after that until the last bucket
    completes is communication the step waits for.

    >>> exposed_after([(0.0, 2.0), (1.5, 4.0)], compute_end=3.0)
    1.0
    """
    clipped = [(max(s, compute_end), e) for s, e in intervals if e > compute_end]
    return union_s(clipped)


def wait_transfer(launch: Sequence[Sequence[float]], done: Sequence[Sequence[float]]
                  ) -> tuple[list[float], list[float]]:
    """Split each rank's bucket time into waiting for the slowest rank and transfer.

    ``launch[r][b]`` / ``done[r][b]``: wall-clock launch and completion of bucket ``b`` on
    rank ``r`` (NaN = absent). A collective cannot start moving data before the last rank
    joins it, so for bucket ``b`` rank ``r`` waits during ``[launch[r][b], L_b]`` and
    transfers during ``[L_b, done[r][b]]`` with ``L_b = max_r launch[r][b]``. Each is the
    union over buckets (buckets in flight together wait together, counted once).
    Valid only when the ranks' clocks agree (same host, or synchronised hosts).

    >>> wait_transfer([[0.0, 10.0], [1.0, 10.5]], [[2.0, 11.0], [2.0, 11.0]])
    ([1.5, 0.0], [1.5, 1.5])
    """
    nranks = len(launch)
    nb = min(len(row) for row in launch) if nranks else 0
    waits: list[list[tuple[float, float]]] = [[] for _ in range(nranks)]
    moves: list[list[tuple[float, float]]] = [[] for _ in range(nranks)]
    for b in range(nb):
        col = [launch[r][b] for r in range(nranks)]
        if any(math.isnan(v) for v in col):
            continue
        last = max(col)
        for r in range(nranks):
            waits[r].append((col[r], last))
            if done[r][b] > last:
                moves[r].append((last, done[r][b]))
    return [union_s(w) for w in waits], [union_s(m) for m in moves]


# -- per-step interval collection -----------------------------------------------------------
@dataclass
class CommStep:
    """Communication of one step, in seconds (host clock on CPU, device time on CUDA)."""

    total_s: float = math.nan
    exposed_s: float = math.nan
    by_kind_s: dict[str, float] = field(default_factory=dict)
    buckets: int = 0
    overlapped_buckets: int = 0
    bucket_launch_wall: list[float] = field(default_factory=list)
    bucket_done_wall: list[float] = field(default_factory=list)
    # Blocking time by the phase it interrupted ("forward", "backward", "other"): the
    # caller takes it out of that phase so that phases and comm_exposed_s do not overlap.
    exposed_by_phase: dict[str, float] = field(default_factory=dict)


@dataclass
class _Interval:
    kind: str
    start: Any  # float seconds (host) or a CUDA event
    end: Any = None
    bucket: int = -1
    start_wall: float = math.nan
    end_wall: float = math.nan
    blocking: bool = False
    phase: str = "other"


class CommTimer:
    """Collects the current step's communication intervals; thread-safe appends.

    ``clock`` is the host clock of the recorder; ``wall`` the epoch clock used for the
    cross-rank wait/transfer split; ``cuda`` switches the marks to CUDA events.
    """

    def __init__(self, clock: Callable[[], float], wall: Callable[[], float],
                 cuda: bool = False) -> None:
        self.clock = clock
        self.wall = wall
        self.cuda = cuda
        self._lock = threading.Lock()
        self._items: list[_Interval] = []
        self.bypass = False  # set while stepscope runs its own collectives
        self.compute_end: Any = None  # mark of the last bucket launch (end of backward)
        self.phase: Callable[[], str] = lambda: "other"  # which phase is running now

    def mark(self) -> Any:
        if self.cuda:
            import torch

            ev = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            ev.record()
            return ev
        return self.clock()

    def begin(self, kind: str, bucket: int = -1, blocking: bool = False) -> _Interval:
        item = _Interval(kind, self.mark(), bucket=bucket, start_wall=self.wall(),
                         blocking=blocking, phase=self.phase())
        if bucket >= 0:
            self.compute_end = item.start
        with self._lock:
            self._items.append(item)
        return item

    def end(self, item: _Interval) -> None:
        item.end = self.mark()
        item.end_wall = self.wall()

    def take(self) -> list[_Interval]:
        with self._lock:
            items, self._items = self._items, []
        return items


def _seconds(mark: Any, ref: Any) -> float:
    if isinstance(mark, float):
        return mark
    return float(ref.elapsed_time(mark)) / 1000.0  # CUDA events: milliseconds


def summarize_comm(items: Sequence[_Interval], compute_end: Any) -> CommStep:
    """Turn a step's intervals into a :class:`CommStep`; CUDA events must be complete."""
    done = [it for it in items if it.end is not None]
    if not done:
        return CommStep()
    ref = done[0].start
    spans = [(_seconds(it.start, ref), _seconds(it.end, ref)) for it in done]
    by_kind: dict[str, float] = {}
    for it, (s, e) in zip(done, spans, strict=False):
        by_kind[it.kind] = by_kind.get(it.kind, 0.0) + max(0.0, e - s)
    buckets = [(it, sp) for it, sp in zip(done, spans, strict=True) if it.bucket >= 0]
    by_phase: dict[str, float] = {}
    for it, (s, e) in zip(done, spans, strict=True):
        if it.blocking:
            by_phase[it.phase] = by_phase.get(it.phase, 0.0) + max(0.0, e - s)
    overlapped = 0
    if buckets:  # DDP: bucket all-reduces finish inside loss.backward()
        c_end = _seconds(compute_end, ref) if compute_end is not None else \
            max(sp[0] for _, sp in buckets)
        tail = exposed_after([sp for _, sp in buckets], c_end)
        by_phase["backward"] = by_phase.get("backward", 0.0) + tail
        overlapped = sum(1 for _, (s, e) in buckets if e <= c_end)
    exposed = sum(by_phase.values())
    ordered = sorted(buckets, key=lambda b: b[0].start_wall)[:MAX_BUCKETS]
    return CommStep(
        total_s=union_s(spans), exposed_s=exposed, by_kind_s=by_kind,
        buckets=len(buckets), overlapped_buckets=overlapped,
        bucket_launch_wall=[b[0].start_wall for b in ordered],
        bucket_done_wall=[b[0].end_wall for b in ordered], exposed_by_phase=by_phase,
    )


def is_complete(items: Sequence[_Interval]) -> bool:
    """True when every CUDA end event has completed (always true for host marks)."""
    for it in items:
        if it.end is not None and not isinstance(it.end, float) and not it.end.query():
            return False
    return True


# -- DDP comm hook -------------------------------------------------------------------------
def timed_comm_hook(timer: CommTimer, inner: Callable[[Any, Any], Any] | None = None,
                    noop: bool = False) -> Callable[[Any, Any], Any]:
    """A DDP comm hook that times each bucket around ``inner`` (default: all-reduce).

    ``noop=True`` returns the local gradients without communicating (the
    ``STEPSCOPE_NOOP_GRAD_SYNC`` isolation experiment: not a valid training run).
    """
    import torch

    if inner is None:
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

        inner = allreduce_hook

    # No annotations on purpose: DDP's _check_comm_hook rejects any ``bucket``/return
    # annotation other than the real GradBucket/Future types, and under
    # ``from __future__ import annotations`` ours would be strings.
    def hook(state, bucket):  # type: ignore[no-untyped-def]
        if noop:
            fut: Any = torch.futures.Future()
            fut.set_result(bucket.buffer())
            return fut
        try:
            item = timer.begin("allreduce", bucket=int(bucket.index()))
        except Exception:
            return inner(state, bucket)
        fut = inner(state, bucket)

        def done(f: Any) -> Any:
            try:
                timer.end(item)
            except Exception:  # measuring must never break training
                pass
            return f.value()

        return fut.then(done)

    return hook


def patch_collectives(dist: Any, timer: CommTimer) -> None:
    """Wrap the ``torch.distributed`` collectives in :data:`COLLECTIVES` with timing.

    A blocking call counts wholly as exposed communication; an ``async_op=True`` call is
    timed from launch to the completion of its future.
    """
    for name, kind in COLLECTIVES.items():
        orig = getattr(dist, name, None)
        if orig is None or getattr(orig, "_stepscope", False):
            continue
        setattr(dist, name, _wrap_collective(orig, kind, timer))


def _wrap_collective(orig: Callable[..., Any], kind: str, timer: CommTimer
                     ) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if timer.bypass:
            return orig(*args, **kwargs)
        blocking = not kwargs.get("async_op", False)
        try:
            item = timer.begin(kind, blocking=blocking)
        except Exception:
            return orig(*args, **kwargs)
        work = orig(*args, **kwargs)
        try:
            if blocking or work is None:
                timer.end(item)
            else:
                work.get_future().then(lambda f: timer.end(item))
        except Exception:  # measuring must never break training
            pass
        return work

    wrapper._stepscope = True  # type: ignore[attr-defined]
    wrapper.__wrapped__ = orig  # type: ignore[attr-defined]
    wrapper.__name__ = getattr(orig, "__name__", kind)
    wrapper.__doc__ = getattr(orig, "__doc__", None)
    return wrapper


# -- cross-rank view -----------------------------------------------------------------------
# Per-rank values exchanged every N steps: medians over the window, then the bucket marks
# of the rank's latest step (for the wait/transfer split), then a host identity.
CROSS_FIELDS: tuple[str, ...] = (
    "step_time_s", "data_wait_s", "forward_s", "backward_s", "optimizer_s", "comm_s",
    "comm_exposed_s", "compute_s",
)


def cross_vector(medians: Sequence[float], launch: Sequence[float], done: Sequence[float],
                 host_id: float) -> list[float]:
    """One rank's gathered vector: its medians of :data:`CROSS_FIELDS` (the session's
    window), the bucket marks of its latest step (padded to :data:`MAX_BUCKETS`), a host
    identity (the wait/transfer split needs one clock)."""
    pad = [math.nan] * MAX_BUCKETS
    lv = (list(launch) + pad)[:MAX_BUCKETS]
    dv = (list(done) + pad)[:MAX_BUCKETS]
    return list(medians) + lv + dv + [host_id]


def cross_rank_summary(step: int, rows: Rows) -> dict[str, Any]:
    """The ``cross_rank`` event from the ranks' vectors (pure; see :func:`cross_vector`).

    Medians and straggler scores as :func:`.crossrank.cross_rank_event` builds them for
    every framework, scored on compute time; plus the DDP wait/transfer split (which the
    exchange drops, :data:`ALIGNED_ONLY`, unless every rank's vector is of one step).
    """
    nf = len(CROSS_FIELDS)
    by_rank = dict(sorted(as_rows(rows).items()))
    ranks = list(by_rank)
    vecs = list(by_rank.values())
    out = cross_rank_event(step, CROSS_FIELDS, {r: v[:nf] for r, v in by_rank.items()},
                           "compute_s")
    launch = [row[nf:nf + MAX_BUCKETS] for row in vecs]
    done = [row[nf + MAX_BUCKETS:nf + 2 * MAX_BUCKETS] for row in vecs]
    hosts = {row[-1] for row in vecs}
    if all(math.isnan(v) for v in launch[0]):
        out["comm_split"] = "not separated: no DDP bucket timings in the sampled step"
    elif len(hosts) > 1:
        out["comm_split"] = ("not separated: ranks run on different hosts and their clocks "
                             "are not known to agree")
    else:
        wait, transfer = wait_transfer(launch, done)
        out["comm_wait_s"] = {str(r): v for r, v in zip(ranks, wait, strict=True)}
        out["comm_transfer_s"] = {str(r): v for r, v in zip(ranks, transfer, strict=True)}
        out["comm_split"] = ("per bucket: wait = last rank's launch - own launch, transfer = "
                             "done - last launch (same host, one clock)")
    return out
