"""``stepscope trace --engine dask``: each rank's trace is read and analysed on a worker.

The rank tables never travel to the client. Each trace file (or MindSpore directory) is
read on a worker and stays there as a Dask future; the client gathers only what the
analysis needs from all ranks (step numbers and ProfilerStep names: :func:`table_facts`),
makes the :class:`~.breakdown.Plan`, asks each worker whether its rank holds device work,
and then gathers one :class:`~.breakdown.RankPart` per rank (its report, warnings and op
totals, a few kilobytes) and combines them with :func:`~.breakdown.combine_parts`. The
local engine runs the same functions over the tables in this process, so both engines give
the same report.

Example::

    report = analyze_on_workers(["profiles/run1"], scheduler="tcp://10.0.0.5:8786")
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import TraceFormatError
from ...proc.engine import dask_client
from ...schema import EventTable
from ...traces import expand_trace_paths, kineto, read_mindspore_dir
from .breakdown import Plan, RankPart, TraceReport, combine_parts, plan_analysis, rank_part
from .breakdown import table_facts as _table_facts
from .ops import has_device_work

__all__ = ["analyze_on_workers"]

Loaded = list[EventTable] | TraceFormatError


def _load(item: tuple[str, str]) -> Loaded:
    """One trace file (a bad one is an error value: skipped, as the local reader does) or
    one MindSpore directory (an error there is raised, as locally)."""
    kind, path = item
    if kind == "mindspore":
        return read_mindspore_dir(Path(path))
    try:
        return [kineto.read(Path(path))]
    except TraceFormatError as exc:
        return exc


def _count(value: Loaded) -> int | TraceFormatError:
    return value if isinstance(value, TraceFormatError) else len(value)


def _pick(value: Loaded, j: int) -> EventTable:
    assert not isinstance(value, TraceFormatError)
    return value[j]


def _facts(t: EventTable) -> dict[str, Any]:
    return {"rank": t.meta.get("rank"), "path": str(t.meta.get("path", "")),
            **_table_facts(t)}


def _fixed(t: EventTable, rank: int | None, skipped: Sequence[str]) -> EventTable:
    """``t`` with the client's rank renumbering and skipped-file notes (a copy: a future's
    value is never modified, it may be shared or moved between workers)."""
    if rank is None and not skipped:
        return t
    meta = dict(t.meta)
    ranks = t.rank
    if rank is not None:
        meta["rank"] = rank
        ranks = np.full_like(t.rank, rank)
    if skipped:
        meta["skipped_files"] = [*meta.get("skipped_files", []), *skipped]
    return dataclasses.replace(t, rank=ranks, meta=meta)


def _device(t: EventTable, plan: Plan) -> bool:
    return has_device_work(t, plan.chosen)


def _part(t: EventTable, index: int, plan: Plan, device: bool, rank: int | None,
          skipped: Sequence[str]) -> RankPart:
    return rank_part(_fixed(t, rank, skipped), index, plan, device)


def _renumber(facts: list[dict[str, Any]]) -> list[int | None]:
    """``traces._check_ranks`` on the facts: two tables claiming one rank are numbered
    after the highest rank seen. The new rank per table, None where it is kept."""
    seen: set[int] = set()
    out: list[int | None] = []
    for i, f in enumerate(facts):
        rank = int(f["rank"] if f["rank"] is not None else i)
        new = None
        if rank in seen:
            rank = new = max(seen) + 1
        seen.add(rank)
        out.append(new)
    return out


def analyze_on_workers(paths: Sequence[str | Path], *, scheduler: str | None = None,
                       processes: int | None = None, hta_compatible: bool = False,
                       steps: tuple[int | None, int | None] | Collection[int] | None = None,
                       top: int = 20, client: Any = None) -> TraceReport:
    """The TraceReport of ``paths`` (as :func:`~stepscope.traces.read_trace` takes them),
    each trace read and analysed on a Dask worker; only per-rank results are gathered.

    ``scheduler``: a cluster's address (its workers must see the paths); default a new
    ``LocalCluster`` of ``processes`` workers. ``client``: an existing Client instead.
    """
    kfiles, ms_dirs = expand_trace_paths(paths)
    items = [("kineto", str(f)) for f in kfiles] + [("mindspore", str(d)) for d in ms_dirs]
    with ExitStack() as stack:
        c = client if client is not None else dask_client(stack, scheduler, processes)
        loaded = c.map(_load, items, pure=False)
        counts = c.gather(c.map(_count, loaded, pure=False))
        errors = [n for n in counts if isinstance(n, TraceFormatError)]
        tables = [c.submit(_pick, f, j, pure=False)
                  for f, n in zip(loaded, counts, strict=True)
                  if not isinstance(n, TraceFormatError) for j in range(n)]
        if not tables:
            raise errors[0] if errors else TraceFormatError(
                f"{', '.join(map(str, paths))}: no trace files found")
        facts = c.gather(c.map(_facts, tables, pure=False))
        renumber = _renumber(facts)
        skipped = [[str(e) for e in errors] if i == 0 else [] for i in range(len(tables))]
        for f, new in zip(facts, renumber, strict=True):
            if new is not None:
                f["rank"] = new
        # read_trace's order: by rank (0 for a table that names none), stable.
        order = sorted(range(len(tables)), key=lambda i: int(facts[i]["rank"] or 0))
        plan = plan_analysis([facts[i] for i in order], hta_compatible, steps)
        device = any(c.gather(c.map(_device, [tables[i] for i in order], plan=plan,
                                    pure=False)))
        parts = c.gather([c.submit(_part, tables[i], k, plan, device, renumber[i], skipped[i],
                                   pure=False) for k, i in enumerate(order)])
        return combine_parts(parts, plan, device, top)
