"""Rank files to the step table: duplicates merged or counted, ranks read in parallel.

A second record of the same (rank, step) is either a *late record* (values logged after
the step closed, e.g. the Trainer's own grad norm: the Recorder writes them without the
step's timing columns) and merged into the step, later values winning as before; or a
*duplicate* (a whole step record again, with its timing: two processes writing one rank
file, a restarted job appending again). A duplicate is never merged: the first record is
kept, the rest are skipped and counted under their reason (every reader validates and counts).

Example::

    table, stats = read_step_files(sorted(Path("RUN/steps").glob("rank-*.jsonl")),
                                   cache_dir=Path("RUN/.cache/steps"))
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from .._fastnp import is_ordered
from ..proc.alloc import tune_for_bulk
from ..schema import AnyArray, StepTable
from .steps_cache import load_cached_run, read_rank_file, uncached_bytes
from .steps_decode import Block, ReadStats, concat_blocks
from .steps_lazy import deferred_table

__all__ = ["read_step_files", "StepRead", "merge_duplicates", "block_to_table"]

DUPLICATE = "duplicate (rank, step)"
DUPLICATE_ACROSS = "duplicate (rank, step) in another rank file"
# Below this many bytes per file a process pool costs more (fork, pickling the columns
# back) than it saves; measured on the benchmark's 400-byte records.
_PARALLEL_MIN_BYTES = 8 << 20
_IDS = ("rank", "step")
# Written when a step closes, never in a late record (Recorder.log after the step).
_TIMING = frozenset({"end_s", "wall_time_s", "step_time_s"})


def _present(block: Block, i: int) -> set[str]:
    out = set()
    for k, col in block.cols.items():
        if k in _IDS:
            continue
        flag = block.flags.get(k)
        if col[i] == col[i] or (flag is not None and flag[i]):
            out.add(k)
    return out


def _order(rank: AnyArray, step: AnyArray) -> AnyArray | None:
    """Stable (rank, step) order, or None when the rows are already strictly in it."""
    if rank.size < 2:
        return None
    dr, ds = np.diff(rank), np.diff(step)
    if bool(np.all((dr > 0) | ((dr == 0) & (ds > 0)))):
        return None
    order: AnyArray = np.lexsort((step, rank))
    return order


def _take(block: Block, idx: AnyArray) -> Block:
    return Block(int(idx.size), {k: v[idx] for k, v in block.cols.items()},
                 {k: v[idx] for k, v in block.flags.items()})


def merge_duplicates(block: Block, source: str, stats: ReadStats,
                     reason: str = DUPLICATE, merge_late: bool = True) -> Block:
    """Rows ordered by (rank, step), one per key: late records merged, duplicates counted."""
    order = _order(block.cols["rank"], block.cols["step"])
    if order is None:
        return block
    b = _take(block, order)
    rank, step = b.cols["rank"], b.cols["step"]
    same = np.flatnonzero((rank[1:] == rank[:-1]) & (step[1:] == step[:-1])) + 1
    if not same.size:
        return b
    b.cols = {k: v.copy() for k, v in b.cols.items()}
    b.flags = {k: v.copy() for k, v in b.flags.items()}
    keep = np.ones(b.n, dtype=bool)
    head = -1
    for p in same.tolist():  # only the repeated rows: a Python loop over the rare case
        head = p - 1 if keep[p - 1] else head
        keep[p] = False
        late = _present(b, p)
        if merge_late and not (late & _TIMING and _present(b, head) & _TIMING):
            for k in late:
                b.cols[k][head] = b.cols[k][p]
                if k in b.flags:
                    b.flags[k][head] = b.flags[k][p]
            continue
        stats.skipped += 1
        stats.duplicates += 1
        stats.count(reason)
        stats.problem(f"{source}: rank {int(rank[p])} step {int(step[p])} recorded twice "
                      "(a whole step record again); the first record is kept")
    return _take(b, np.flatnonzero(keep))


def block_to_table(block: Block) -> StepTable:
    cols: dict[str, AnyArray] = {}
    for k, v in block.cols.items():
        if block.never_recorded(k):
            continue  # never recorded: the table holds it as one shared NaN, not n floats
        cols[k] = v.astype(np.int64) if k in _IDS else v
        if k in block.flags:
            cols[f"{k}_nan"] = block.flags[k].astype(np.float64)
    return StepTable(cols) if block.n else StepTable.empty()


def _read_merged(path: Path, cache_dir: Path | None) -> tuple[Block, ReadStats, bool]:
    """One rank file's rows, duplicates merged, and whether the cache holds all of it."""
    block, stats, whole = read_rank_file(path, cache_dir)
    block = merge_duplicates(block, path.name, stats)
    stats.records = block.n
    return block, stats, whole


def _read_one(path: Path, cache_dir: Path | None) -> tuple[Block, ReadStats]:
    block, stats, _ = _read_merged(path, cache_dir)
    return block, stats


def _read_to_cache(path: Path, cache_dir: Path | None) -> tuple[Block | None, ReadStats]:
    """A worker's read: when the cache now holds the whole file, only the stats come back
    (the parent loads the columns from the cache, faster than unpickling them, and checks
    the file against it again)."""
    block, stats, whole = _read_merged(path, cache_dir)
    return (None, stats) if whole else (block, stats)


def _from_cache(files: Sequence[Path], cache_dir: Path | None
                ) -> tuple[StepTable, list[ReadStats]] | None:
    """The run from its cache alone, when it holds every file whole and the rows are
    strictly in (rank, step) order (then no rank has a repeated step to merge): a table
    whose columns are read from the cache when first used (``_steps_lazy``)."""
    if cache_dir is None or not files:
        return None
    got = load_cached_run(list(files), cache_dir)
    if got is None:
        return None
    src, stats = got
    rank, step = src.column("rank"), src.column("step")
    if not is_ordered(rank, step, strict=True):
        src.close()
        return None
    return deferred_table(src, {"rank": rank, "step": step}), stats


def _workers(files: Sequence[Path], cache_dir: Path | None, processes: int | None) -> int:
    """Worker processes for this read (1: read here)."""
    workers = min(len(files), processes or os.cpu_count() or 1)
    if workers <= 1 or processes is not None:
        return workers
    # Only bytes to decode pay for processes: cached columns load faster here than they
    # could be pickled back from a worker.
    big = sum(uncached_bytes(f, cache_dir) for f in files) >= _PARALLEL_MIN_BYTES * max(2, workers)
    return workers if big else 1


_Parts = list[tuple[Block, ReadStats]] | tuple[StepTable, list[ReadStats]]


class StepRead:
    """A read of rank files, started: worker processes decode them while the caller does
    other work, and ``result()`` waits for them and returns the table and its stats.

    ``compare`` analyses run A while run B's files are decoded: this process is idle while
    the workers decode (both CPUs are theirs), then works alone while they are gone.
    The worker processes are this read's own: ``result()`` or ``close()`` (or leaving a
    ``with`` block) ends them.

    Example::

        with StepRead(files_b, cache_b) as pending:
            prepare(table_a)                  # runs while B's files are decoded
            table_b, stats_b = pending.result()
    """

    def __init__(self, files: Sequence[Path], cache_dir: Path | None = None,
                 processes: int | None = None) -> None:
        self._files, self._cache_dir = list(files), cache_dir
        self._pool: ProcessPoolExecutor | None = None
        self._got: Iterator[tuple[Block | None, ReadStats]] | None = None
        self._whole = _from_cache(self._files, cache_dir)
        if self._whole is not None:
            return
        workers = _workers(self._files, cache_dir, processes)
        if workers <= 1:
            return
        # fork: the workers need nothing but this module, already imported. Their
        # allocator keeps its freed blocks (``_alloc``); the caller's process is left as
        # it is.
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else None
        self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                                         initializer=tune_for_bulk)
        try:  # every chunk is submitted now: the workers start at once
            self._got = self._pool.map(_read_to_cache, self._files,
                                       [cache_dir] * len(self._files),
                                       chunksize=max(1, len(self._files) // (4 * workers)))
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> StepRead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the workers (waiting for the files they are decoding); idempotent."""
        pool, self._pool, self._got = self._pool, None, None
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)

    def result(self) -> tuple[StepTable, ReadStats]:
        """All ranks' records as one table ordered by (rank, step), and what was skipped."""
        try:
            parts = self._parts()
        finally:
            self.close()
        return _to_table(parts)

    def _parts(self) -> _Parts:
        files, cache_dir = self._files, self._cache_dir
        if self._whole is not None:
            return self._whole
        if self._got is None:
            return [_read_one(f, cache_dir) for f in files]
        got = list(self._got)
        blocks = [b for b, _ in got]
        if all(b is not None for b in blocks):
            return [(b, s) for b, s in got if b is not None]
        whole = _from_cache(files, cache_dir) if all(b is None for b in blocks) else None
        if whole is not None:  # the run's table, the stats of each file
            return whole
        # Some files changed while read, or mixed results: read the rest here, as usual.
        return [(b, s) if b is not None else _read_one(f, cache_dir)
                for f, (b, s) in zip(files, got, strict=True)]


def read_step_files(files: Sequence[Path], cache_dir: Path | None = None,
                    processes: int | None = None) -> tuple[StepTable, ReadStats]:
    """All ranks' records as one table ordered by (rank, step), and what was skipped.

    ``cache_dir``: where the per-rank columnar cache lives (None: no cache).
    ``processes``: worker processes (default: CPUs, when the files are large; 1 = serial).
    """
    return StepRead(files, cache_dir, processes).result()


def _to_table(parts: _Parts) -> tuple[StepTable, ReadStats]:
    stats = ReadStats()
    if isinstance(parts, tuple):  # the whole run from its cache
        for s in parts[1]:
            stats.merge(s)
        return parts[0], stats
    for _, s in parts:
        stats.merge(s)
    several = len(parts) > 1
    block = concat_blocks((b for b, _ in parts), consume=True)
    del parts
    if several and block.n:
        before = block.n
        block = merge_duplicates(block, "steps/", stats, DUPLICATE_ACROSS, merge_late=False)
        stats.records -= before - block.n
    return block_to_table(block), stats
