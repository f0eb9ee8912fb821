"""A wholly cached run's columns, each read from its cache segments when first used.

A table of 9.6 million rows holds ~2 GB in its ~27 float64 columns, and a command reads
about half of them (``report`` never looks at ``end_s``; ``compare`` at none of the memory
columns). :func:`load_cached_run` (``_steps_cache``) checks every segment's ``.npy`` header
and keeps each segment file open; :class:`CachedColumns` then reads one column's rows of
every segment straight into one array (``os.preadv``, no mapping, no second copy), and the
step table built on it (:func:`deferred_table`) asks for a column the first time an
analysis reads it. The values are those the eager read gave: the same bytes, the same
columns (a known column that holds nothing is one shared NaN, as ``block_to_table`` makes
it), in the same order.

The open segment files keep the columns readable while another reader compacts or
rebuilds the cache (a replaced or removed file stays readable through its descriptor);
they are closed when the columns are no longer referenced.
"""

from __future__ import annotations

import io
import os
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .schema import (
    _STEP_DTYPES,
    STEP_COLUMNS,
    AnyArray,
    StepTable,
    _as_column,
    _never_recorded,
)

__all__ = ["CachedColumns", "Part", "open_part", "deferred_table", "RESIDENT_BYTES"]

# Columns a table keeps read at once (bytes). A command reads ~25 columns; at 9.6 million
# rows each is 77 MB, and all of them plus the analyses' selections and temporaries passed
# 2.3 GB (1.8 GB with this bound). A column dropped is read again from the cache (page
# cache: ~20 ms for 77 MB); a table of 27 columns under 2.4 million rows never drops one.
RESIDENT_BYTES = 1 << 29
_F8 = np.dtype("<f8")
_FORMAT: Any = np.lib.format  # its readers are untyped
_HEADER_MAX = 1 << 16


@dataclass(frozen=True)
class Part:
    """One open segment: its float64 (columns x rows) matrix starts at ``offset``."""

    fd: int
    offset: int
    at: int  # first row of the run's table
    rows: int
    index: Mapping[str, int]  # column -> row of the matrix


def open_part(path: Path, columns: Sequence[str], rows: int, at: int) -> Part | None:
    """The segment at ``path`` opened, when its header says a C-order float64 matrix of
    ``len(columns)`` x ``rows`` and the file holds it all; else None (and nothing open)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        head = io.BytesIO(os.pread(fd, _HEADER_MAX, 0))
        version = _FORMAT.read_magic(head)
        read = {(1, 0): _FORMAT.read_array_header_1_0,
                (2, 0): _FORMAT.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError(f"npy version {version}")
        shape, fortran, dtype = read(head)
        offset = head.tell()
        if (dtype != _F8 or fortran or tuple(shape) != (len(columns), rows)
                or os.fstat(fd).st_size < offset + 8 * rows * len(columns)):
            raise ValueError("not this segment")
    except (OSError, ValueError):
        os.close(fd)
        return None
    return Part(fd, offset, at, rows, {c: i for i, c in enumerate(columns)})


def _close(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


class CachedColumns:
    """The columns of a run's open segments (``parts`` in row order), ``n`` rows in all,
    ``names`` in first-seen order; ``flags`` (explicit-NaN flags) are already loaded."""

    def __init__(self, n: int, names: Sequence[str], parts: Sequence[Part],
                 flags: dict[str, AnyArray]) -> None:
        self.n = n
        self.names = list(names)
        self.flags = flags
        self._parts = list(parts)
        self._closer = weakref.finalize(self, _close, [p.fd for p in self._parts])

    def close(self) -> None:
        self._closer()

    def column(self, name: str) -> AnyArray:
        """One column of every segment (NaN in a segment without it), as one array."""
        out = np.empty(self.n)
        for p in self._parts:
            dst = out[p.at:p.at + p.rows]
            i = p.index.get(name)
            if i is None:
                dst[:] = np.nan
                continue
            buf, pos = dst.data.cast("B"), p.offset + 8 * p.rows * i
            while buf.nbytes:
                got = os.preadv(p.fd, [buf], pos)
                if got <= 0:
                    raise OSError(f"cache segment shorter than its header says ({name})")
                buf, pos = buf[got:], pos + got
        return out


def _cost(arr: AnyArray) -> int:
    return 0 if arr.ndim == 1 and arr.strides == (0,) else int(arr.nbytes)


class _Deferred(Mapping[str, AnyArray]):
    """A step table's columns, each read from ``src`` on first access and kept while they
    fit ``RESIDENT_BYTES`` (the least recently used one is dropped first and read again
    when asked for: same values, a new array)."""

    __slots__ = ("_src", "_names", "_got", "_held")

    def __init__(self, src: CachedColumns, names: list[str],
                 got: dict[str, AnyArray]) -> None:
        self._src = src
        self._names = names
        self._got: OrderedDict[str, AnyArray] = OrderedDict(got)
        self._held = sum(_cost(a) for a in got.values())

    def _load(self, name: str) -> AnyArray:
        src = self._src
        base = name.removesuffix("_nan")
        if name != base and base in src.flags:
            return src.flags[base].astype(np.float64)
        if name not in src.names:  # a known column no segment holds
            return (np.zeros(src.n, dtype=np.int64) if _STEP_DTYPES[name] == "int64"
                    else _never_recorded(src.n))
        arr = src.column(name)
        if (name in _STEP_DTYPES and _STEP_DTYPES[name] != "int64"
                and name not in src.flags and bool(np.isnan(arr).all())):
            return _never_recorded(src.n)  # never recorded: one shared NaN, not n floats
        return _as_column(name, arr)

    def __getitem__(self, name: str) -> AnyArray:
        got = self._got.get(name)
        if got is not None:
            self._got.move_to_end(name)
            return got
        if name not in self._names:
            raise KeyError(name)
        got = self._load(name)
        self._held += _cost(got)
        while self._held > RESIDENT_BYTES and self._got:
            self._held -= _cost(self._got.popitem(last=False)[1])
        self._got[name] = got
        return got

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._names


def deferred_table(src: CachedColumns, loaded: Mapping[str, AnyArray]) -> StepTable:
    """The step table of ``src`` (rows already in (rank, step) order, no repeated pair),
    columns in ``block_to_table``'s order; ``loaded``: columns read already (e.g. rank)."""
    if not src.n:
        src.close()
        return StepTable.empty()
    known = [c.name for c in STEP_COLUMNS]
    extra: list[str] = []
    for k in src.names:
        if k not in _STEP_DTYPES:
            extra.append(k)
        if k in src.flags:
            extra.append(f"{k}_nan")
    names = list(dict.fromkeys(known + extra))
    table = StepTable.__new__(StepTable)
    table._cols = _Deferred(src, names, {k: _as_column(k, v) for k, v in loaded.items()})
    table._n = src.n
    return table
