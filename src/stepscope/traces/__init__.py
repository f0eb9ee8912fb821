"""Profiler-trace readers: format detection (here, in one place) and dispatch.

Formats: PyTorch profiler / Kineto Chrome traces (:mod:`.kineto`: ``.json``, ``.json.gz`` or
a directory of per-rank files) and MindSpore profiler output directories
(:mod:`.mindspore`: ``*_ascend_ms/``). Each reader returns
:class:`~stepscope.schema.EventTable`; per-rank files are parsed in parallel processes.

Example::

    from stepscope.traces import read_trace
    tables = read_trace("profiles/2026-11-30T12:00:00Z")   # one EventTable per rank
    [t.meta["rank"] for t in tables]
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from types import ModuleType

from ..errors import TraceFormatError
from ..proc.engine import map_items
from ..schema import EventTable
from . import kineto

__all__ = ["read_trace", "detect_format", "trace_files", "FORMATS", "expand_trace_paths",
           "read_mindspore_dir"]

FORMATS: tuple[str, ...] = ("kineto", "mindspore")
_KINETO_SUFFIXES = (".json", ".json.gz")
# Below this many bytes per file a process pool costs more (fork + pickling) than it saves.
_PARALLEL_MIN_BYTES = 4 << 20


def _mindspore() -> ModuleType | None:
    try:
        from . import mindspore
    except ImportError:
        return None
    return mindspore


def _mindspore_hint(path: Path) -> bool:
    """Cheap, reader-independent signs of MindSpore profiler output."""
    if path.name.endswith("_ascend_ms") or (path / "ASCEND_PROFILER_OUTPUT").is_dir():
        return True
    if path.is_file() and path.parent.name == "ASCEND_PROFILER_OUTPUT":
        return True
    return path.is_dir() and any(p.name.endswith("_ascend_ms") for p in _children(path))


def _children(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError:
        return []


def detect_format(path: str | Path) -> str:
    """Name of the trace format at ``path`` (one of ``FORMATS``), or TraceFormatError.

    Example::

        detect_format("rank0.pt.trace.json.gz")     # 'kineto'
    """
    p = Path(path)
    if not p.exists():
        raise TraceFormatError(f"{p}: no such file or directory; expected a PyTorch profiler "
                               "trace (.json/.json.gz), a directory of them, or a MindSpore "
                               "profiler directory (*_ascend_ms).")
    ms = _mindspore()
    if ms is not None and ms.looks_like(p):
        return "mindspore"
    if _mindspore_hint(p):
        return "mindspore"
    if p.is_file() and kineto.looks_like(p):
        return "kineto"
    if p.is_dir() and trace_files(p):
        return "kineto"
    if p.is_file() and kineto.truncated_gzip(p):
        raise TraceFormatError(f"{p}: truncated gzip file (the compressed stream ends early: "
                               "the copy or the profiler's write was cut off); copy it again "
                               "or capture a new trace")
    raise TraceFormatError(
        f"{p}: not a recognised profiler trace; expected a PyTorch profiler (Kineto) trace "
        "(.json/.json.gz with 'traceEvents'), a directory holding such files, or a MindSpore "
        "profiler directory (*_ascend_ms with ASCEND_PROFILER_OUTPUT or FRAMEWORK).")


def trace_files(directory: Path) -> list[Path]:
    """Kineto trace files directly in ``directory`` (else one level down), sorted by name."""
    def scan(d: Path) -> list[Path]:
        # A truncated .json.gz is kept so that it is reported (skipped with a warning),
        # not silently left out of a rank's analysis.
        return [f for f in _children(d) if f.is_file()
                and f.name.lower().endswith(_KINETO_SUFFIXES)
                and (kineto.looks_like(f) or kineto.truncated_gzip(f))]
    found = scan(directory)
    if not found:
        for sub in _children(directory):
            if sub.is_dir():
                found.extend(scan(sub))
    return found


def _expand(paths: Iterable[str | Path]) -> tuple[list[Path], list[Path]]:
    kineto_files: list[Path] = []
    ms_dirs: list[Path] = []
    for raw in paths:
        p = Path(raw)
        fmt = detect_format(p)
        if fmt == "mindspore":
            ms_dirs.append(p)
        elif p.is_dir():
            kineto_files.extend(trace_files(p))
        else:
            kineto_files.append(p)
    return kineto_files, ms_dirs


def expand_trace_paths(paths: Sequence[str | Path]) -> tuple[list[Path], list[Path]]:
    """(Kineto trace files, MindSpore directories) that ``paths`` name, as ``read_trace``
    finds them; TraceFormatError when there are none."""
    if not paths:
        raise TraceFormatError("no trace path given; pass a trace file or directory")
    kfiles, ms_dirs = _expand(paths)
    if not kfiles and not ms_dirs:
        raise TraceFormatError(f"{', '.join(map(str, paths))}: no trace files found; expected "
                               "*.json / *.json.gz PyTorch profiler traces or *_ascend_ms dirs.")
    return kfiles, ms_dirs


def read_mindspore_dir(path: Path) -> list[EventTable]:
    """The tables of one MindSpore profiler directory (one per rank in it)."""
    return _read_mindspore(path)


def _read_mindspore(path: Path) -> list[EventTable]:
    ms = _mindspore()
    if ms is None:
        raise TraceFormatError(
            f"{path}: looks like MindSpore profiler output, but the MindSpore reader "
            "(stepscope.traces.mindspore) is unavailable in this install; update stepscope.")
    tables: list[EventTable] = ms.read(path)
    return tables


def read_trace(path_or_paths: str | Path | Sequence[str | Path], *,
               processes: int | None = None, engine: str = "local",
               scheduler: str | None = None) -> list[EventTable]:
    """Read traces into one EventTable per rank (sorted by rank), parsing files in parallel.

    ``path_or_paths``: a trace file, a directory of per-rank files, a MindSpore
    ``*_ascend_ms`` directory (or a folder of them), or a list of any of these.
    ``processes``: worker processes for per-rank files (default: min(files, CPUs); 1 = serial).
    ``engine``: ``local`` (this machine's processes) or ``dask`` (each file a task on a Dask
    distributed cluster: a new local one, or the one at ``scheduler``; see
    :mod:`stepscope.proc.engine`). The tables are this function's result, so the dask engine
    brings them to the caller; to analyse 1,000+ ranks without that, use
    :func:`stepscope.analysis.trace.distributed.analyze_on_workers` (what ``stepscope trace
    --engine dask`` and ``trace diff --engine dask`` run), which gathers one small result
    per rank.

    Example::

        tables = read_trace(["rank0.pt.trace.json.gz", "rank1.pt.trace.json.gz"])
    """
    paths = [path_or_paths] if isinstance(path_or_paths, (str, os.PathLike)) \
        else list(path_or_paths)
    kfiles, ms_dirs = expand_trace_paths(paths)
    if engine == "local" and not scheduler:
        tables = _read_kineto_files(kfiles, processes)
        for d in ms_dirs:
            tables.extend(_read_mindspore(d))
    else:
        tables = map_items(kineto.read, kfiles, engine=engine, scheduler=scheduler,
                           processes=processes)
        for per_dir in map_items(_read_mindspore, ms_dirs, engine=engine,
                                 scheduler=scheduler, processes=processes):
            tables.extend(per_dir)
    _check_ranks(tables)
    return sorted(tables, key=lambda t: int(t.meta.get("rank", 0)))


def _read_or_error(path: Path) -> EventTable | TraceFormatError:
    try:
        return kineto.read(path)
    except TraceFormatError as exc:
        return exc


def _read_kineto_files(files: list[Path], processes: int | None) -> list[EventTable]:
    """One table per readable file. A bad rank file (truncated, corrupt) is skipped and
    named in the first table's ``meta["skipped_files"]`` (the breakdown warns about it)
    while the other ranks are analysed; if every file is bad, the first error is raised."""
    workers = min(len(files), processes or os.cpu_count() or 1)
    big = sum(_size(f) for f in files) >= _PARALLEL_MIN_BYTES * len(files)
    if workers <= 1 or len(files) < 2 or (processes is None and not big):
        results = [_read_or_error(f) for f in files]
    else:
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            results = list(pool.map(_read_or_error, files))
    tables = [r for r in results if isinstance(r, EventTable)]
    errors = [r for r in results if isinstance(r, TraceFormatError)]
    if errors and not tables:
        raise errors[0]
    if errors:
        tables[0].meta.setdefault("skipped_files", []).extend(str(e) for e in errors)
    return tables


def _size(p: Path) -> int:
    try:
        return p.stat().st_size
    except OSError:
        return 0


def _check_ranks(tables: list[EventTable]) -> None:
    seen: dict[int, str] = {}
    for i, t in enumerate(tables):
        rank = int(t.meta.get("rank", i))
        if rank in seen:
            # Two files claim one rank (e.g. traces without distributedInfo): number them.
            rank = max(seen) + 1
            t.meta["rank"] = rank
            t.rank[:] = rank
        seen[rank] = str(t.meta.get("path", ""))
