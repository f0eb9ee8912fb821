"""Operator ranking: total and self time, count, and queue time of device kernels.

Device traces rank device work (kernels, memcpy/memset) by total device time; each row also
carries the launch-to-start delay (``queue``: kernel start minus the start of its host
launch call). The field report's rule: ops that wait long are blocked, not slow (often too
many small ops). Host-only traces rank ``cpu_op`` events by self time (time not spent in a
nested child op on the same thread).

Example::

    rows = op_totals(read_trace("trace_diff_control"))
    top_ops(rows, 10)[0].name
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from ...schema import EVENT_KINDS, EventTable
from .overlap import device_mask, host_compute_mask, step_table

__all__ = ["OpRow", "op_totals", "top_ops", "self_times", "has_device_work", "op_partial",
           "op_rows", "OpPartial"]

# One table's ops: name -> count, total/self time, queue delays, kind and where. Small
# (one entry per op name): what a worker sends back instead of its table.
OpPartial = dict[str, dict[str, Any]]


@dataclass(frozen=True)
class OpRow:
    """One op name aggregated over ranks and the selected steps."""

    name: str
    kind: str  # compute | comm | memcpy | cpu
    where: str  # device | host
    count: int
    total_us: float
    self_us: float
    mean_us: float
    queue_mean_us: float | None  # device only: mean launch-to-start delay
    queue_max_us: float | None
    share_pct: float  # of the summed time of all ranked ops
    # The primitive the op runs (MindSpore: ``Conv2DBackpropFilter`` of
    # ``Gradients/.../Conv2DBackpropFilter-op3``); the name itself where the trace has no
    # separate type (PyTorch: ``aten::mm`` and kernel names are their own type).
    op_type: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def self_times(t: EventTable, rows: NDArray[Any]) -> NDArray[Any]:
    """Self time of each row in ``rows`` (host ops): duration minus nested children's."""
    out: NDArray[Any] = t.dur_us[rows].astype(np.float64).copy()
    if not len(rows):
        return out
    order = np.lexsort((-t.dur_us[rows], t.start_us[rows], t.stream[rows]))
    starts, durs = t.start_us[rows][order], t.dur_us[rows][order]
    threads = t.stream[rows][order]
    ends = starts + durs
    child_sum = np.zeros(len(order))
    stack: list[int] = []
    prev_thread = None
    for i in range(len(order)):
        th = threads[i]
        if th != prev_thread:
            stack.clear()
            prev_thread = th
        while stack and ends[stack[-1]] <= starts[i]:
            stack.pop()
        if stack:
            child_sum[stack[-1]] += durs[i]
        stack.append(i)
    out[order] = durs - child_sum
    return out


def _types(t: EventTable) -> list[str]:
    """Op type per name index (``meta["op_types"]`` where the reader knows them)."""
    known = t.meta.get("op_types") or []
    return [str(known[i]) if i < len(known) and known[i] else n
            for i, n in enumerate(t.names)]


def _aggregate(names: list[str], name_idx: NDArray[Any], dur: NDArray[Any], self_us: NDArray[Any],
               kinds: NDArray[Any], queue: NDArray[Any] | None, where: str,
               acc: dict[str, dict[str, Any]], types: list[str]) -> None:
    uniq, first, inv = np.unique(name_idx, return_index=True, return_inverse=True)
    tot = np.bincount(inv, weights=dur, minlength=len(uniq))
    slf = np.bincount(inv, weights=self_us, minlength=len(uniq))
    cnt = np.bincount(inv, minlength=len(uniq))
    queues: list[NDArray[Any]] = []
    if queue is not None:
        order = np.argsort(inv, kind="stable")
        queues = np.split(queue[order], np.cumsum(cnt)[:-1])
    for j, ni in enumerate(uniq.tolist()):
        row = acc.setdefault(names[ni], {"count": 0, "total": 0.0, "self": 0.0, "q": [],
                                         "kind": EVENT_KINDS[int(kinds[first[j]])],
                                         "where": where, "type": types[ni]})
        row["count"] += int(cnt[j])
        row["total"] += float(tot[j])
        row["self"] += float(slf[j])
        if queues:
            q = queues[j]
            row["q"].append(q[np.isfinite(q)])


def has_device_work(t: EventTable, steps: Collection[int] | None = None) -> bool:
    """Whether ``t`` holds device work in the selected steps (then ops rank device work)."""
    return bool(device_mask(t, steps).any())


def op_partial(t: EventTable, steps: Collection[int] | None, device: bool) -> OpPartial:
    """One table's part of :func:`op_totals` (``device``: any table has device work)."""
    acc: OpPartial = {}
    if device:
        m = device_mask(t, steps)
        launch = t.extra.get("launch_us")
        queue = (t.start_us[m] - launch[m]) if launch is not None else \
            np.full(int(m.sum()), np.nan)
        _aggregate(t.names, t.name[m], t.dur_us[m], t.dur_us[m], t.kind[m], queue,
                   "device", acc, _types(t))
    else:
        m = host_compute_mask(t)
        if step_table(t):
            m &= (t.step >= 0) if steps is None else np.isin(t.step, list(steps))
        rows = np.flatnonzero(m)
        _aggregate(t.names, t.name[rows], t.dur_us[rows], self_times(t, rows),
                   t.kind[rows], None, "host", acc, _types(t))
    return acc


def op_totals(tables: Sequence[EventTable], steps: Collection[int] | None = None
              ) -> list[OpRow]:
    """All ops, aggregated over ranks, sorted by total (device) or self (host) time."""
    device = any(has_device_work(t, steps) for t in tables)
    return op_rows([op_partial(t, steps, device) for t in tables], device)


def op_rows(parts: Sequence[OpPartial], device: bool) -> list[OpRow]:
    """The ranking from each table's :func:`op_partial`, merged in table order (the sums
    are the same additions, in the same order, as over the tables themselves)."""
    acc: OpPartial = {}
    for part in parts:
        for name, p in part.items():
            row = acc.setdefault(name, {"count": 0, "total": 0.0, "self": 0.0, "q": [],
                                        "kind": p["kind"], "where": p["where"],
                                        "type": p["type"]})
            row["count"] += p["count"]
            row["total"] += p["total"]
            row["self"] += p["self"]
            row["q"].extend(p["q"])
    key = "total" if device else "self"
    grand = sum(r[key] for r in acc.values()) or 1.0
    out = []
    for name, r in acc.items():
        q = np.concatenate(r["q"]) if r["q"] else np.zeros(0)
        out.append(OpRow(
            name=name, kind=r["kind"], where=r["where"], count=r["count"],
            total_us=r["total"], self_us=r["self"], mean_us=r["total"] / max(r["count"], 1),
            queue_mean_us=float(q.mean()) if len(q) else None,
            queue_max_us=float(q.max()) if len(q) else None,
            share_pct=round(100.0 * r[key] / grand, 2), op_type=r["type"]))
    out.sort(key=lambda r: -(r.total_us if device else r.self_us))
    return out


def top_ops(rows: Sequence[OpRow], n: int = 10) -> list[OpRow]:
    """The first ``n`` rows of an ``op_totals`` ranking."""
    return list(rows[:n])
