"""Rank-level temporal breakdown (idle / compute / non-compute) and comm/compute overlap.

Two conventions, both pure functions of one rank's EventTable:

``exact_temporal`` (stepscope's default): device events (kernels, memcpy/memset) launched in
whole ProfilerSteps (all of them, or the ones asked for), exact float times, communication
recognised under every NCCL/RCCL/MSCCL spelling (``traces.kineto.is_comm_kernel``), device
sync waits not counted as busy. On a trace without device events (CPU training) it gives the
host view: the window is the union of the steps, compute is the union of ``cpu_op``
intervals off the communication threads, communication is the union of gloo intervals.

``hta_temporal`` reproduces HTA 0.5.0 (``TraceAnalysis.get_temporal_breakdown`` and
``get_comm_comp_overlap``, read from its source): it drops events without ``dur``/``cat`` and
the ``Trace`` span, rounds float timestamps inward to whole µs (ceil start, floor end) when
the trace has float ``ts``, keeps host events that start before the last ProfilerStep (or
that step's end with ``include_last_step``) and the device events whose correlation id
matches one of them (only when the loaded traces name more than one ProfilerStep), then
takes every remaining row with ``args.stream != -1``; kernel span = first start to last end,
idle = span - union, compute = union of kernels that are not ``^nccl.*Kernel``, not
``^(Memcpy|Memset|dma)`` and do not match ``(.*Memcpy|Memset|.*Sync)``; overlap = the share
of the ``^nccl.*Kernel`` union during which a compute kernel runs.

Example::

    t = read_trace("trace_diff_control")[0]
    hta_temporal(t).pct()    # {'idle_pct': 16.2, 'compute_pct': 61.23, ...}
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from ...schema import EVENT_KINDS, EventTable
from . import intervals as iv

__all__ = ["Temporal", "exact_temporal", "hta_temporal", "host_compute_mask", "step_table",
           "device_mask", "step_window", "stream_busy"]

# HTA 0.5.0 hta/utils/utils.py name rules (re.match, i.e. anchored at the start).
HTA_COMM_RE = re.compile(r"^nccl.*Kernel")
HTA_MEMORY_RE = re.compile(r"(^Memcpy)|(^Memset)|(^dma)")
HTA_NOT_COMPUTE_RE = re.compile(r"(^nccl.*Kernel)|(.*(Memcpy)|(Memset))|(.*Sync)")
# HTA's trace_filter: device-level sync events count as GPU events even without a stream.
HTA_SYNC_NAMES = ("Event Sync", "Context Sync")
_DEVICE_WORK = tuple(EVENT_KINDS.index(k) for k in ("compute", "comm", "memcpy"))


@dataclass(frozen=True)
class Temporal:
    """One rank's breakdown over its window; times in µs."""

    view: str  # "accelerator" or "host"
    convention: str  # "exact" or "hta-0.5.0"
    window_us: float
    idle_us: float
    compute_us: float
    non_compute_us: float
    comm_us: float
    overlap_us: float

    def pct(self) -> dict[str, float | None]:
        """Shares of the window in percent (2 decimals, as HTA reports them)."""
        w = self.window_us

        def p(x: float) -> float:
            return round(100.0 * x / w, 2) if w > 0 else 0.0
        return {
            "idle_pct": p(self.idle_us), "compute_pct": p(self.compute_us),
            "non_compute_pct": p(self.non_compute_us),
            "comm_comp_overlap_pct": (round(100.0 * self.overlap_us / self.comm_us, 2)
                                      if self.comm_us > 0 else None),
        }


def _name_flags(names: list[str], pattern: re.Pattern[str]) -> npt.NDArray[np.bool_]:
    return np.fromiter((pattern.match(n) is not None for n in names), dtype=bool,
                       count=len(names))


def _hta_merge(ts: NDArray[Any], end: NDArray[Any]) -> tuple[NDArray[Any], NDArray[Any]]:
    """HTA's merge_kernel_intervals: groups by ts > running max of earlier ends."""
    if not len(ts):
        return ts, end
    order = np.argsort(ts, kind="stable")
    ts, end = ts[order], end[order]
    new = np.empty(len(ts), dtype=bool)
    new[0] = True
    new[1:] = ts[1:] > np.maximum.accumulate(end)[:-1]
    first = np.flatnonzero(new)
    return ts[first], np.maximum.reduceat(end, first)


def _hta_overlap(comm: tuple[NDArray[Any], NDArray[Any]],
                 comp: tuple[NDArray[Any], NDArray[Any]]) -> float:
    """HTA's status sweep: comm +1/-1, compute +2/-2; time spent at level 3."""
    t = np.concatenate([comm[0], comm[1], comp[0], comp[1]])
    w = np.concatenate([np.ones(len(comm[0])), -np.ones(len(comm[1])),
                        np.full(len(comp[0]), 2.0), np.full(len(comp[1]), -2.0)])
    if not len(t):
        return 0.0
    order = np.argsort(t, kind="stable")
    t, level = t[order], np.cumsum(w[order])
    at3 = level[:-1] == 3
    return float(np.sum(t[1:][at3] - t[:-1][at3]))


def _hta_rows(t: EventTable, include_last_step: bool, filter_steps: bool
              ) -> tuple[NDArray[Any], NDArray[Any], NDArray[Any]] | None:
    """(mask of rows HTA analyses, ts, end) after its parsing, rounding and filtering."""
    cats = t.meta.get("categories")
    if "cat" not in t.extra or "hta_stream" not in t.extra or cats is None:
        return None
    dropped = [i for i, c in enumerate(cats) if c in ("", "Trace")]
    keep = ~np.isin(t.extra["cat"], dropped)
    ts, end = t.start_us, t.start_us + t.dur_us
    if t.meta.get("ts_is_float"):
        ts, end = np.ceil(ts), np.floor(end)
    stream, corr = t.extra["hta_stream"], t.extra["correlation"]
    sync = np.isin(t.name, [i for i, n in enumerate(t.names) if n in HTA_SYNC_NAMES])
    gpu = ((stream >= 0) & (corr >= 0)) | sync
    if filter_steps:
        cpu = keep & ~gpu
        ps = cpu & np.isin(t.name, [i for i, n in enumerate(t.names) if "ProfilerStep" in n])
        if not ps.any():
            return None
        cpu &= (ts <= end[ps].max()) if include_last_step else (ts < ts[ps].max())
        keep = cpu | (keep & gpu & np.isin(corr, corr[cpu]))
    return keep & (stream != -1), ts, end


def hta_temporal(t: EventTable, *, include_last_step: bool = False,
                 filter_steps: bool = True) -> Temporal | None:
    """HTA 0.5.0's temporal breakdown and overlap for one rank (None where HTA fails).

    ``filter_steps``: whether HTA would filter by ProfilerStep, i.e. whether the traces
    loaded together name more than one distinct ProfilerStep (HTA checks its symbol table).
    """
    rows = _hta_rows(t, include_last_step, filter_steps)
    if rows is None or not rows[0].any():
        return None
    mask, ts, end = rows
    g_ts, g_end = _hta_merge(ts[mask], end[mask])
    span = float(g_end[-1] - g_ts[0])
    # Sum lengths, not ends minus starts: at epoch-µs magnitude (1e15) summing the raw
    # endpoints loses whole µs (HTA avoids it by first rebasing to the earliest event).
    idle = span - float(np.sum(g_end - g_ts))
    comm_name = _name_flags(t.names, HTA_COMM_RE)
    compute_name = ~comm_name & ~_name_flags(t.names, HTA_MEMORY_RE) \
        & ~_name_flags(t.names, HTA_NOT_COMPUTE_RE)
    cm = mask & compute_name[t.name]
    comp = _hta_merge(ts[cm], end[cm])
    compute = float(np.sum(comp[1] - comp[0]))
    nm = mask & comm_name[t.name]
    comm = _hta_merge(ts[nm], end[nm])
    comm_total = float(np.sum(comm[1] - comm[0]))
    return Temporal("accelerator", "hta-0.5.0", span, idle, compute, span - compute - idle,
                    comm_total, _hta_overlap(comm, comp) if comm_total else 0.0)


def _ends(t: EventTable) -> NDArray[np.float64]:
    out: NDArray[np.float64] = t.start_us + np.maximum(t.dur_us, 0.0)
    return out


def step_table(t: EventTable) -> dict[int, tuple[float, float]]:
    """{step number: (start_us, dur_us)}: the Kineto reader's ``meta["steps"]``, else the
    table's ``step`` kind rows (e.g. MindSpore's inferred ``Step#N`` markers)."""
    steps = t.meta.get("steps")
    if isinstance(steps, dict) and steps:
        return {int(k): (float(v[0]), float(v[1])) for k, v in steps.items()}
    rows = np.flatnonzero(t.kind == EVENT_KINDS.index("step"))
    out: dict[int, tuple[float, float]] = {}
    for i in rows.tolist():
        num = int(t.step[i])
        if num < 0:
            m = re.search(r"(\d+)\s*$", t.names[int(t.name[i])])
            num = int(m.group(1)) if m else -1
        if num >= 0:
            out[num] = (float(t.start_us[i]), float(t.dur_us[i]))
    return out


def device_mask(t: EventTable, steps: Collection[int] | None) -> npt.NDArray[np.bool_]:
    """Device work rows (kernels, memcpy/memset) in whole selected steps."""
    on_dev = t.extra.get("on_device")
    mask = np.isin(t.kind, _DEVICE_WORK)
    if on_dev is not None:
        mask &= on_dev.astype(bool)
    if step_table(t):
        mask &= (t.step >= 0) if steps is None else np.isin(t.step, list(steps))
    return mask


def host_compute_mask(t: EventTable) -> npt.NDArray[np.bool_]:
    """Host compute rows: ``cpu_op`` events (Kineto) or compute/cpu ops (other readers),
    off the communication threads."""
    on_dev = t.extra.get("on_device")
    cats = t.meta.get("categories")
    if "cat" in t.extra and cats is not None:
        mask = np.isin(t.extra["cat"], [i for i, c in enumerate(cats) if c == "cpu_op"])
    else:
        mask = np.isin(t.kind, [EVENT_KINDS.index("compute"), EVENT_KINDS.index("cpu")])
    if on_dev is not None:
        mask &= ~on_dev.astype(bool)
    comm_threads = t.meta.get("comm_threads") or []
    if comm_threads:
        mask &= ~np.isin(t.stream, comm_threads)
    return mask


def step_window(t: EventTable, steps: Collection[int] | None) -> iv.Intervals:
    """Union of the selected ProfilerStep intervals (all events' span if no steps)."""
    table = step_table(t)
    chosen = [(s, s + d) for k, (s, d) in table.items() if steps is None or int(k) in steps]
    if chosen:
        a = np.array(chosen, dtype=np.float64)
        return iv.union(a[:, 0], a[:, 1])
    if not len(t) or (table and steps is not None):  # nothing, or no step selected
        return iv.EMPTY
    return iv.union(np.array([t.start_us.min()]), np.array([_ends(t).max()]))


def exact_temporal(t: EventTable, steps: Collection[int] | None = None) -> Temporal | None:
    """stepscope's breakdown: accelerator view when there are device events, else host."""
    end = _ends(t)
    dev = device_mask(t, steps)
    comm_k, comp_k = EVENT_KINDS.index("comm"), EVENT_KINDS.index("compute")
    if dev.any() and t.meta.get("device") != "cpu":
        busy = iv.union(t.start_us[dev], end[dev])
        span = float(end[dev].max() - t.start_us[dev].min())  # zero-length events count
        comp = iv.union(t.start_us[dev & (t.kind == comp_k)], end[dev & (t.kind == comp_k)])
        comm = iv.union(t.start_us[dev & (t.kind == comm_k)], end[dev & (t.kind == comm_k)])
        busy_us, comp_us = iv.total(busy), iv.total(comp)
        return Temporal("accelerator", "exact", span, span - busy_us, comp_us,
                        busy_us - comp_us, iv.total(comm), iv.total(iv.intersect(comm, comp)))
    window = step_window(t, steps)
    if not len(window[0]):
        return None
    lo, hi = float(window[0][0]), float(window[1][-1])
    hc = host_compute_mask(t)
    comm_m = (t.kind == comm_k)
    data_m = t.kind == EVENT_KINDS.index("data")
    comp = iv.intersect(iv.union(t.start_us[hc], end[hc]), window)
    comm = iv.intersect(iv.union(t.start_us[comm_m], end[comm_m]), window)
    data = iv.intersect(iv.union(t.start_us[data_m], end[data_m]), window)
    busy_us = iv.total(iv.union_of(comp, comm, data))
    w_us = iv.total(window) if len(window[0]) else hi - lo
    comp_us = iv.total(comp)
    return Temporal("host", "exact", w_us, w_us - busy_us, comp_us, busy_us - comp_us,
                    iv.total(comm), iv.total(iv.intersect(comm, comp)))


def stream_busy(t: EventTable, steps: Collection[int] | None = None) -> dict[int, float]:
    """Accelerator view per stream: busy time (union of its device work) in µs."""
    dev = device_mask(t, steps)
    if not dev.any() or t.meta.get("device") == "cpu":
        return {}
    end = _ends(t)
    out: dict[int, float] = {}
    for stream in np.unique(t.stream[dev]).tolist():
        m = dev & (t.stream == stream)
        out[int(stream)] = iv.total(iv.union(t.start_us[m], end[m]))
    return out
