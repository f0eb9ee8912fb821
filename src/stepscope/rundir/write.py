"""The write side of the run directory that ``store.RunDir`` builds on (import ``store``).

Split from :mod:`stepscope.rundir.store` by concept: what survives a full or read-only disk
(the step file writer that drops and counts, run.json's reserved blocks), the per-process
claim of a step file, and the cross-rank side channel files. Only ``store`` imports this.
"""

from __future__ import annotations

import errno
import os
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson

from ..schema import RunMeta

__all__ = ["StepFileWriter", "CrossRankFiles", "claim_step_file", "meta_bytes",
           "overwrite_in_place", "META_OPTS", "NO_SPACE", "META_RESERVE_BYTES",
           "CROSSRANK_DIR", "CROSS_VIEW"]

META_OPTS = orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY
# ENOSPC (disk full), EDQUOT (quota): the cases where run.json's reserve is used.
NO_SPACE = {errno.ENOSPC, errno.EDQUOT}
# Spaces after run.json's JSON (valid trailing whitespace): the room the final status write
# may use when the disk is full. The final update adds status, error, records_dropped and
# a degraded note: well under 1 KiB; 2 KiB leaves room for a long error message.
META_RESERVE_BYTES = 2048
# Cross-rank side channel: each rank's latest window medians and rank 0's merged view.
CROSSRANK_DIR = "crossrank"
CROSS_VIEW = "view.json"


def meta_bytes(meta: RunMeta) -> bytes:
    """run.json's content: the JSON, then the reserve (see :data:`META_RESERVE_BYTES`)."""
    data = orjson.dumps(meta.to_dict(), option=META_OPTS, default=str) + b"\n"
    return data + b" " * META_RESERVE_BYTES + b"\n"


def overwrite_in_place(path: Path, data: bytes) -> bool:
    """Rewrite ``path`` within its current size (no new blocks); False if it does not fit."""
    try:
        size = path.stat().st_size
        if len(data) + 1 > size:
            return False
        fd = os.open(path, os.O_WRONLY)
        try:  # same length as before: the file keeps its blocks, nothing is allocated
            os.pwrite(fd, data + b"\n" + b" " * (size - len(data) - 1), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        return False
    return True


def claim_step_file(base: Path) -> Path:
    """A step file this process alone writes: ``base`` (``rank-N.jsonl``), made exclusively.

    When it exists already (another process resolved the same rank, or the run is
    resumed), the file is ``rank-N.p<pid>.jsonl`` (then ``...p<pid>-<k>``): two
    processes never append to one file, and readers key rows by the rank inside them.
    An unwritable directory gives ``base``; the writer counts what it drops.
    """
    stem = base.name.removesuffix(".jsonl")
    names = [base.name] + [f"{stem}.p{os.getpid()}{f'-{k}' if k else ''}.jsonl"
                           for k in range(100)]
    for name in names:
        path = base.with_name(name)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
            return path
        except FileExistsError:
            continue
        except OSError:
            return base
    return base


class StepFileWriter:
    """Appends pre-built records to one rank's JSONL file; never raises ``OSError``.

    Each ``write`` is one ``os.write`` of whole lines on an ``O_APPEND`` descriptor, so a
    crash leaves at most one torn line at the end, which readers skip. A failed write drops
    its records whole (a partial write is cut back, so no torn line is left mid-file) and
    counts them in ``dropped``; ``first_error`` keeps the first reason. The next write tries
    again, so recording resumes when space returns.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self.failed = False
        self.dropped = 0
        self.first_error: str | None = None

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return self._fd

    def write(self, records: Iterable[Mapping[str, Any]]) -> int:
        # orjson writes NaN/inf as null, which readers load back as NaN.
        lines = [orjson.dumps(r) for r in records]
        if not lines:
            return 0
        data = b"\n".join(lines) + b"\n"
        start = -1
        try:
            fd = self._open()
            start = os.lseek(fd, 0, os.SEEK_END)
            view = memoryview(data)
            while view:
                n = os.write(fd, view)
                view = view[n:]
        except OSError as exc:
            self.dropped += len(lines)
            self._cut_back(start)
            if not self.failed:
                self.failed = True
                self.first_error = f"{type(exc).__name__}: {exc}"
                warnings.warn(
                    f"stepscope: cannot write step records to {self.path} ({exc}); "
                    "training continues, records are being dropped",
                    RuntimeWarning, stacklevel=2,
                )
            self.close()
            return 0
        return len(lines)

    def _cut_back(self, size: int) -> None:
        """Drop the part of a failed write that reached the file (a torn mid-file line)."""
        if self._fd is None or size < 0:
            return
        try:
            os.ftruncate(self._fd, size)
        except OSError:
            pass

    def close(self) -> None:
        if self._fd is not None:
            try:
                os.close(self._fd)
            except OSError:
                pass
            self._fd = None


class CrossRankFiles:
    """The cross-rank side channel in a run directory (``RunDir`` inherits it): files,
    never a collective (see ``stepscope.record.crossrank.FileExchange``)."""

    path: Path

    def _cross_path(self, name: str) -> Path:
        return self.path / CROSSRANK_DIR / name

    def _replace_json(self, dest: Path, payload: Mapping[str, Any]) -> bool:
        """Atomically replace ``dest`` with ``payload``; False (and no temp file) on error."""
        tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
        try:
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY,
                                         default=str))
            os.replace(tmp, dest)
        except OSError:
            tmp.unlink(missing_ok=True)
            return False
        return True

    def _load_json(self, path: Path) -> dict[str, Any] | None:
        try:
            obj = orjson.loads(path.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        return obj if isinstance(obj, dict) else None

    def publish_rank_window(self, rank: int, payload: Mapping[str, Any]) -> bool:
        """This rank's latest cross-rank window (``crossrank/rank-N.json``, replaced whole)."""
        return self._replace_json(self._cross_path(f"rank-{rank:05d}.json"), payload)

    def rank_windows(self) -> dict[int, dict[str, Any]]:
        """Every rank's latest published window; unreadable or half-written files are
        skipped (the writer replaces atomically, so a reader sees old or new, not a mix)."""
        out: dict[int, dict[str, Any]] = {}
        for f in sorted((self.path / CROSSRANK_DIR).glob("rank-*.json")):
            rank = f.name[len("rank-"):-len(".json")]
            obj = self._load_json(f)
            if rank.isdigit() and obj is not None:
                out[int(rank)] = obj
        return out

    def publish_cross_view(self, event: Mapping[str, Any]) -> bool:
        """The merged view (rank 0's latest ``cross_rank`` event) every rank can read."""
        return self._replace_json(self._cross_path(CROSS_VIEW), event)

    def cross_view(self) -> dict[str, Any] | None:
        return self._load_json(self._cross_path(CROSS_VIEW))
