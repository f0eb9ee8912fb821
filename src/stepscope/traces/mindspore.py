"""Reader for MindSpore profiler output directories (``*_ascend_ms/``) -> EventTable.

Also read here (``traces/mindspore_legacy.py``): msprof ``PROF_*`` directories and the
flat ``profiler/`` folder of MindSpore <= 2.3.

One event table per rank found under a path. Formats, each with one declarative mapping
(raw key -> column, type, default) in ``traces/mindspore_formats.py``; per rank directory
the first present of kernel_details.csv, trace_view.json, cpu_op_execute_timestamp gives the
op events (they describe the same ops), the others add to them:

* ``ASCEND_PROFILER_OUTPUT/trace_view.json`` (Chrome trace, ``ts``/``dur`` are strings in
  epoch microseconds; the process name says what a row is, see ``TRACE_VIEW_PROCESSES``);
* ``FRAMEWORK/cpu_op_execute_timestamp_{rank}.txt`` (CPU; used when trace_view.json is
  absent): ``name;type;start_ns,dur_ms,tid start_ns,dur_ms,tid ...``;
* ``ASCEND_PROFILER_OUTPUT/kernel_details.csv`` (Ascend device kernels, with ``Step Id``);
* ``ASCEND_PROFILER_OUTPUT/step_trace_time.csv`` (Ascend per-step summary) -> ``meta``;
* ``ASCEND_PROFILER_OUTPUT/communication.json`` (Ascend collectives with wait/transit):
  events when no other file has the collectives, else a wait/transit summary in ``meta``.

Extra columns: ``phase`` (index into ``meta["phase_names"]``; -1 on step/phase rows) and,
from kernel_details.csv / communication.json, ``wait_us`` (and ``transit_us``, ``sync_us``).

The Ascend formats follow the column names MindSpore 2.10's own writers use
(``mindspore/profiler/analysis/viewer/ascend_*_viewer.py``); no Ascend output exists on this
machine, so they are tested with small files written to that layout.

The CPU profiler writes no step markers and no phase annotations. Steps and phases are
inferred (``traces/mindspore_phases.py``) and ``meta["step_source"]`` /
``meta["phase_source"]`` say how. Times are rebased: ``start_us`` counts from
``meta["time_origin_us"]`` (epoch microseconds, a whole multiple of 1e9 so ranks of one job
share it), which keeps nanosecond digits that float64 would lose at epoch magnitude.

Example::

    from stepscope.traces import mindspore as msr
    if msr.looks_like(path):
        tables = msr.read(path)          # one EventTable per rank
        tables[0].meta["phase_source"]
"""

from __future__ import annotations

import csv
import re
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ..errors import TraceFormatError
from ..schema import EVENT_KINDS, EventTable
from .mindspore_formats import (
    Builder,
    read_communication,
    read_cpu_op_timestamps,
    read_kernel_details,
    read_step_trace,
    read_trace_view,
)
from .mindspore_legacy import (
    is_legacy_dir,
    is_msprof_dir,
    legacy_rank,
    msprof_rank,
    read_legacy,
    read_msprof,
)
from .mindspore_phases import MARKERS_FILE, annotate, op_type

__all__ = ["read", "looks_like", "read_rank_dir", "find_rank_dirs"]

ASCEND_MS_SUFFIX = "_ascend_ms"
OUTPUT_DIR = "ASCEND_PROFILER_OUTPUT"
FRAMEWORK_DIR = "FRAMEWORK"


# -- discovery and dispatch ----------------------------------------------------------------
_RANK_FILE_RE = re.compile(r"_(\d+)\.(?:txt|csv|json)$")


def _rank_of(d: Path) -> int | None:
    """Rank from the per-rank file names MindSpore writes (``*_{rank}.txt``/``.json``);
    an msprof directory's device id."""
    if is_msprof_dir(d):
        return msprof_rank(d)
    if is_legacy_dir(d):
        return legacy_rank(d)
    candidates = [*sorted((d / FRAMEWORK_DIR).glob("cpu_op_execute_timestamp_*.txt")),
                  *sorted(d.glob("profiler_info_*.json")),
                  *sorted((d / FRAMEWORK_DIR).glob("cpu_op_detail_info_*.csv"))]
    for f in candidates:
        m = _RANK_FILE_RE.search(f.name)
        if m:
            return int(m.group(1))
    return None


def _is_rank_dir(d: Path) -> bool:
    """A MindSpore ``*_ascend_ms`` output, an msprof ``PROF_*`` directory, or an older
    MindSpore ``profiler/`` folder (``traces/mindspore_legacy.py``)."""
    return d.is_dir() and ((d / OUTPUT_DIR).is_dir() or (d / FRAMEWORK_DIR).is_dir()
                           or is_msprof_dir(d) or is_legacy_dir(d))


def find_rank_dirs(path: Path, max_depth: int = 4) -> list[Path]:
    """Profiler output directories (``*_ascend_ms`` or any dir with ASCEND_PROFILER_OUTPUT /
    FRAMEWORK) at or under ``path``, searched ``max_depth`` levels deep, sorted."""
    path = Path(path)
    if path.is_file():
        path = path.parent.parent if path.parent.name in (OUTPUT_DIR, FRAMEWORK_DIR) \
            else path.parent
    if _is_rank_dir(path):
        return [path]
    found: list[Path] = []
    level = [path] if path.is_dir() else []
    for _ in range(max_depth):
        nxt: list[Path] = []
        for d in level:
            for c in sorted(p for p in d.iterdir() if p.is_dir()):
                (found if _is_rank_dir(c) else nxt).append(c)
        level = nxt
    return sorted(found)


def looks_like(path: str | Path) -> bool:
    """True when ``path`` is (or holds) MindSpore profiler output this reader understands."""
    p = Path(path)
    try:
        if p.is_file():
            return p.name in ("trace_view.json", "kernel_details.csv", "step_trace_time.csv",
                              "communication.json") and any(
                a.name.endswith(ASCEND_MS_SUFFIX) or a.name == OUTPUT_DIR for a in p.parents)
        return p.is_dir() and bool(find_rank_dirs(p))
    except OSError:
        return False


def read_rank_dir(d: Path, rank: int | None = None) -> EventTable:
    """One ``*_ascend_ms`` directory -> its EventTable (steps and phases annotated)."""
    d = Path(d)
    rank = _rank_of(d) if rank is None else rank
    out, fw = d / OUTPUT_DIR, d / FRAMEWORK_DIR
    meta: dict[str, Any] = {"framework": "mindspore", "path": str(d)}
    kernels, trace_view = out / "kernel_details.csv", out / "trace_view.json"
    op_txt = sorted(fw.glob("cpu_op_execute_timestamp_*.txt")) if fw.is_dir() else []
    if is_msprof_dir(d):
        b, skipped = read_msprof(d)
        meta["format"] = "msprof"
        meta["rank_source"] = "the msprof device id (msprof does not know the job's rank)"
    elif is_legacy_dir(d) and not out.is_dir() and not fw.is_dir():
        b, skipped = read_legacy(d)
        meta["format"] = "mindspore profiler/ (MindSpore <= 2.3 layout)"
    elif kernels.is_file():
        b = Builder(str(kernels))
        skipped = read_kernel_details(kernels, b)
    elif trace_view.is_file():
        b = Builder(str(trace_view))
        skipped = read_trace_view(trace_view, b)
    elif op_txt:
        b = Builder(str(op_txt[0]))
        skipped = read_cpu_op_timestamps(op_txt[0], b)
    else:
        raise TraceFormatError(
            f"{d}: no MindSpore profiler data found; expected {OUTPUT_DIR}/trace_view.json, "
            f"{OUTPUT_DIR}/kernel_details.csv or {FRAMEWORK_DIR}/cpu_op_execute_timestamp_*.txt "
            "(did the profiler's analysis step run? call profiler.stop() or analyse())")
    comm = out / "communication.json"
    if comm.is_file():
        has_comm = EVENT_KINDS.index("comm") in b.kind
        cb = b if not has_comm else Builder(str(comm))
        skipped += read_communication(comm, cb)
        if has_comm:  # the same collectives are already events: keep the summary only
            meta["communication_wait_us"] = float(np.nansum(cb.extra.get("wait_us", [])))
            meta["communication_transit_us"] = float(
                np.nansum(cb.extra.get("transit_us", [])))
    step_trace = out / "step_trace_time.csv"
    if step_trace.is_file():
        meta["step_trace"] = read_step_trace(step_trace)
    if not b.kind:
        raise TraceFormatError(f"{d}: the profiler output holds no operator events "
                               f"({b.source}); was any step profiled?")
    meta["rows_skipped"] = skipped
    if rank is None:
        meta["rank_source"] = "no per-rank file name or device id found; rank 0 assumed"
    table = b.build(0 if rank is None else rank, meta)
    # The breakdown keys ranks by meta["rank"] (else the table's position): one rank's
    # directory read alone (rank 1 of an msrun capture) must stay rank 1.
    table.meta["rank"] = 0 if rank is None else rank
    known = {**_cpu_op_types(fw), **b.op_types}
    table.meta["op_types"] = [known.get(n) or op_type(n) for n in table.names]
    steps, phases = _load_markers(d, 0 if rank is None else rank)
    return annotate(table, steps, phases)


def _cpu_op_types(fw: Path) -> dict[str, str]:
    """Full op name -> op type from ``FRAMEWORK/cpu_op_detail_info_{rank}.csv`` (CPU)."""
    out: dict[str, str] = {}
    for f in sorted(fw.glob("cpu_op_detail_info_*.csv")) if fw.is_dir() else []:
        try:
            with f.open(newline="", errors="replace") as fh:
                for row in csv.DictReader(fh):
                    name, kind = row.get("full_op_name"), row.get("op_type")
                    if name and kind:
                        out[name.strip()] = kind.strip()
        except (OSError, csv.Error):
            continue
    return out


def _load_markers(d: Path, rank: int
                  ) -> tuple[list[dict[str, Any]] | None, list[dict[str, Any]] | None]:
    """Step windows and phase windows stepscope's own capture wrote beside the profile
    (epoch us), if any: (steps, phases)."""
    for f in (d / MARKERS_FILE, d.parent / MARKERS_FILE):
        if f.is_file():
            try:
                data = orjson.loads(f.read_bytes())
            except (orjson.JSONDecodeError, OSError):
                return None, None
            doc = data if isinstance(data, dict) else {"steps": data}
            return _mine(doc.get("steps"), rank), _mine(doc.get("phases"), rank) or None
    return None, None


def _mine(rows: Any, rank: int) -> list[dict[str, Any]]:
    return [s for s in rows or [] if isinstance(s, dict) and s.get("rank", rank) == rank]


def read(path: Path) -> list[EventTable]:
    """Every rank under ``path`` (a ``*_ascend_ms`` dir, or a folder holding several).

    Raises TraceFormatError when nothing readable is found or a file is broken.
    """
    path = Path(path)
    if not path.exists():
        raise TraceFormatError(f"{path} does not exist; pass a MindSpore profiler output "
                               "directory (*_ascend_ms) or a folder that holds them")
    dirs = find_rank_dirs(path)
    if not dirs:
        raise TraceFormatError(
            f"{path}: no MindSpore profiler output found (looked for *{ASCEND_MS_SUFFIX} "
            f"directories with {OUTPUT_DIR}/ or {FRAMEWORK_DIR}/ up to 4 levels deep)")
    ranks = [_rank_of(d) for d in dirs]
    seen: dict[int, Path] = {}
    for d, r in zip(dirs, ranks, strict=True):
        if r is not None and r in seen:
            raise TraceFormatError(
                f"{path}: rank {r} appears in two profiler outputs ({seen[r]} and {d}); "
                "pass one capture (one profiles/<timestamp>/ directory or one *_ascend_ms)")
        if r is not None:
            seen[r] = d
    free = (r for r in range(len(dirs) + len(seen)) if r not in seen)
    tables = [read_rank_dir(d, r if r is not None else next(free))
              for d, r in zip(dirs, ranks, strict=True)]
    return sorted(tables, key=lambda t: int(t.rank[0]) if len(t) else 0)
