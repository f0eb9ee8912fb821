"""Per-step phase breakdown of one rank's trace: data / forward / backward / exposed comm /
optimizer / other / idle, which add up to the step's wall time.

Each step is the host ``ProfilerStep#N`` window ``[start, start + dur)``. Every instant of
it gets exactly one label, by priority: data wait > exposed communication > optimizer >
backward > forward > other (something runs but no phase is annotated) > idle (nothing
runs). Phases come from annotations (``PHASE_RULES``); when a step has no backward
annotation, autograd engine events (``autograd::engine::evaluate_function: ...``) stand in
and the row says so. Communication is the union of device collective kernels (GPU) or gloo
intervals (CPU); "exposed" is the part with no compute running (device kernels on GPU,
host ``cpu_op`` intervals on CPU). Device activity is placed where it ran on the shared
clock (Kineto aligns device timestamps to the host clock), so on a GPU trace a step's bar
shows what the device did during that step's wall time.

Example::

    rows = step_rows(read_trace("ddp2_gloo_basic")[0])
    rows[0].forward_us, rows[0].comm_exposed_us
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ...schema import EVENT_KINDS, EventTable
from . import intervals as iv
from .overlap import device_mask, host_compute_mask, step_table

__all__ = ["StepRow", "PHASE_RULES", "BAR_PHASES", "step_rows"]

# Annotation name -> phase. Sources: stepscope's own record_function names, torch's
# DistributedDataParallel.forward / Optimizer.step#X.step / Optimizer.zero_grad#X.zero_grad
# record functions, the "## name ##" convention of Meta's trainers (HTA test traces), and
# bare phase names (the MindSpore reader's inferred phase rows).
PHASE_RULES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("forward", re.compile(r"^forward$|stepscope\.forward$|## forward\b|"
                           r"DistributedDataParallel\.forward$|"
                           r"FullyShardedDataParallel\.forward$")),
    ("backward", re.compile(r"^backward$|stepscope\.backward$|## backward\b")),
    ("optimizer", re.compile(r"^optimizer$|stepscope\.optimizer$|Optimizer\.(step|zero_grad)#|"
                             r"## (optimizer|zero_grad) ##")),
)
AUTOGRAD_PREFIX = "autograd::engine::evaluate_function:"
# Stacked-bar order (the field report's split) and the two remainders.
BAR_PHASES: tuple[str, ...] = ("data", "forward", "backward", "comm_exposed", "optimizer",
                               "other", "idle")


@dataclass(frozen=True)
class StepRow:
    """One step of one rank; every ``*_us`` in ``BAR_PHASES`` sums to ``step_time_us``."""

    rank: int
    step: int
    start_us: float
    step_time_us: float
    data_us: float
    forward_us: float
    backward_us: float
    comm_exposed_us: float
    optimizer_us: float
    other_us: float
    idle_us: float
    comm_us: float  # all communication inside the step window
    comm_overlapped_us: float  # ... of which compute ran at the same time
    compute_us: float  # union of compute inside the window
    no_activity_us: float  # window minus (compute | comm | data), phases ignored
    backward_source: str  # "annotation", "autograd events" or "none"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _union_mask(t: EventTable, mask: NDArray[Any], end: NDArray[Any]) -> iv.Intervals:
    return iv.union(t.start_us[mask], end[mask])


def _phase_sets(t: EventTable, end: NDArray[Any]) -> dict[str, iv.Intervals]:
    on_dev = t.extra.get("on_device")
    host = ~on_dev.astype(bool) if on_dev is not None else np.ones(len(t), dtype=bool)
    phase = host & (t.kind == EVENT_KINDS.index("phase"))
    rows = np.flatnonzero(phase)
    ids = np.unique(t.name[rows])
    out: dict[str, iv.Intervals] = {}
    for ph, pattern in PHASE_RULES:
        wanted = [int(i) for i in ids if pattern.search(t.names[int(i)])]
        out[ph] = _union_mask(t, phase & np.isin(t.name, wanted), end)
    auto = [i for i, n in enumerate(t.names) if n.startswith(AUTOGRAD_PREFIX)]
    out["autograd"] = _union_mask(t, host & np.isin(t.name, auto), end)
    out["data"] = _union_mask(t, host & (t.kind == EVENT_KINDS.index("data")), end)
    return out


def _activity(t: EventTable, end: NDArray[Any], steps: Collection[int] | None
              ) -> tuple[iv.Intervals, iv.Intervals, iv.Intervals]:
    """(compute, comm, busy) interval sets: device view if the trace has device work."""
    comm_k, comp_k = EVENT_KINDS.index("comm"), EVENT_KINDS.index("compute")
    dev = device_mask(t, None)
    if dev.any() and t.meta.get("device") != "cpu":
        comp = _union_mask(t, dev & (t.kind == comp_k), end)
        comm = _union_mask(t, dev & (t.kind == comm_k), end)
        return comp, comm, _union_mask(t, dev, end)
    comp = _union_mask(t, host_compute_mask(t), end)
    comm = _union_mask(t, t.kind == comm_k, end)
    return comp, comm, iv.union_of(comp, comm)


def step_rows(t: EventTable, steps: Collection[int] | None = None) -> list[StepRow]:
    """Per-step breakdown of one rank (only steps in ``steps`` when given)."""
    table = step_table(t)
    if not table:
        return []
    end = t.start_us + np.maximum(t.dur_us, 0.0)
    sets = _phase_sets(t, end)
    comp, comm, busy = _activity(t, end, steps)
    rank = int(t.meta.get("rank", int(t.rank[0]) if len(t) else 0))
    rows = []
    for num, (start, dur) in sorted(table.items()):
        if steps is not None and int(num) not in steps:
            continue
        rows.append(_one_step(rank, int(num), float(start), float(start) + float(dur),
                              sets, comp, comm, busy))
    return rows


def _one_step(rank: int, num: int, lo: float, hi: float, sets: dict[str, iv.Intervals],
              comp: iv.Intervals, comm: iv.Intervals, busy: iv.Intervals) -> StepRow:
    window: iv.Intervals = (np.array([lo]), np.array([hi]))
    c_comp, c_comm, c_busy = iv.clip(comp, lo, hi), iv.clip(comm, lo, hi), iv.clip(busy, lo, hi)
    data = iv.clip(sets["data"], lo, hi)
    exposed = iv.subtract(c_comm, c_comp)
    backward = iv.clip(sets["backward"], lo, hi)
    source = "annotation"
    if not len(backward[0]):
        backward = iv.clip(sets["autograd"], lo, hi)
        source = "autograd events" if len(backward[0]) else "none"
    labels = (("data", data), ("comm_exposed", exposed),
              ("optimizer", iv.clip(sets["optimizer"], lo, hi)), ("backward", backward),
              ("forward", iv.clip(sets["forward"], lo, hi)), ("other", c_busy))
    amounts: dict[str, float] = {}
    remaining = window
    for label, ivs in labels:
        taken = iv.intersect(remaining, ivs)
        amounts[label] = iv.total(taken)
        remaining = iv.subtract(remaining, taken)
    return StepRow(
        rank=rank, step=num, start_us=lo, step_time_us=hi - lo,
        data_us=amounts["data"], forward_us=amounts["forward"],
        backward_us=amounts["backward"], comm_exposed_us=amounts["comm_exposed"],
        optimizer_us=amounts["optimizer"], other_us=amounts["other"],
        idle_us=iv.total(remaining), comm_us=iv.total(c_comm),
        comm_overlapped_us=iv.total(iv.intersect(c_comm, c_comp)),
        compute_us=iv.total(c_comp),
        no_activity_us=(hi - lo) - iv.total(iv.union_of(c_comp, c_comm, data)),
        backward_source=source,
    )
