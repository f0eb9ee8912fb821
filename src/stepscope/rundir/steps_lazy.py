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

The bound on columns held (``RESIDENT_BYTES``) is one for the process, over every such
table alive: ``compare`` holds two runs' tables (and ``--repeat`` more), and a bound per
table let each keep its own 512 MB (1 GB of the 4.2 GB peak of a 9.6-million-record
pair).
"""

from __future__ import annotations

import functools
import io
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..schema import _STEP_DTYPES, STEP_COLUMNS, AnyArray, StepTable, _as_column, _never_recorded

__all__ = ["CachedColumns", "Part", "open_part", "deferred_table", "RESIDENT_BYTES"]

# Columns the process keeps read at once, over all deferred tables (bytes). A command reads
# ~25 columns; at 9.6 million rows each is 77 MB, and all of them plus the analyses'
# selections and temporaries passed 2.3 GB (1.8 GB with 512 MB held). Two such runs in
# ``compare`` peaked at 2,098 MB cold with 512 MB held in all, so 256 MB: ~3 columns at
# that size, the ones in use; a column dropped is read again from the cache (page cache:
# ~20 ms for 77 MB; 98 reads instead of 73 for a 1.9 M-record pair at the same ratio),
# and one table of 27 columns under 1.2 million rows never drops one.
RESIDENT_BYTES = 1 << 28
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


@functools.lru_cache(maxsize=64)
def _header(shape: tuple[int, int]) -> bytes:
    """The header ``np.save`` writes for a C-order float64 matrix of ``shape``."""
    out = io.BytesIO()
    _FORMAT.write_array_header_1_0(out, {"descr": _FORMAT.dtype_to_descr(_F8),
                                         "fortran_order": False, "shape": shape})
    return out.getvalue()


def _parsed_offset(fd: int, shape: tuple[int, int]) -> int:
    """Where the data of the segment open at ``fd`` starts, from its parsed header (a
    header written otherwise than :func:`_header`'s, e.g. by another numpy)."""
    head = io.BytesIO(os.pread(fd, _HEADER_MAX, 0))
    version = _FORMAT.read_magic(head)
    read = {(1, 0): _FORMAT.read_array_header_1_0,
            (2, 0): _FORMAT.read_array_header_2_0}.get(version)
    if read is None:
        raise ValueError(f"npy version {version}")
    got, fortran, dtype = read(head)
    if dtype != _F8 or fortran or tuple(got) != shape:
        raise ValueError("not this segment")
    return head.tell()


def open_part(path: Path, columns: Sequence[str], rows: int, at: int) -> Part | None:
    """The segment at ``path`` opened, when its header says a C-order float64 matrix of
    ``len(columns)`` x ``rows`` and the file holds it all; else None (and nothing open).

    The header is compared with the bytes ``np.save`` writes for that shape (parsing it
    costs a ``literal_eval``: ~0.1 s for a 1,024-rank run), and parsed only when they
    differ."""
    try:  # a derived file: never read through a link (see .derived)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    shape = (len(columns), rows)
    try:
        want = _header(shape)
        offset = (len(want) if os.pread(fd, len(want), 0) == want
                  else _parsed_offset(fd, shape))
        if os.fstat(fd).st_size < offset + 8 * rows * len(columns):
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


class _Resident:
    """The columns every deferred table of the process holds, least recently used first:
    over ``RESIDENT_BYTES`` in all, the oldest is dropped from its table (any table)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # a collected table's finalizer may run inside add
        self._order: OrderedDict[tuple[int, str], int] = OrderedDict()  # -> bytes
        self._tables: dict[int, weakref.ref[_Deferred]] = {}
        self.held = 0

    def touch(self, table: _Deferred, name: str) -> None:
        # No lock: one C call on the OrderedDict is atomic, and the rules make ~30,000 of
        # these at 1,024 ranks (the lock made each ~5 us). A column dropped meanwhile is
        # simply not there to move.
        try:
            self._order.move_to_end((id(table), name))
        except KeyError:
            pass

    def add(self, table: _Deferred, name: str, cost: int) -> None:
        """``table`` now holds ``name``; older columns are dropped while over the bound
        (the new one is kept whatever its size, as a read needs it)."""
        with self._lock:
            if id(table) not in self._tables:
                self._tables[id(table)] = weakref.ref(table)
                weakref.finalize(table, self.forget, id(table))
            self.held += cost
            while self.held > RESIDENT_BYTES and self._order:
                (owner, old), c = self._order.popitem(last=False)
                self.held -= c
                ref = self._tables.get(owner)
                victim = ref() if ref is not None else None
                if victim is not None:
                    victim._got.pop(old, None)
            self._order[(id(table), name)] = cost

    def forget(self, table_id: int) -> None:
        """A table was collected: its columns no longer count."""
        with self._lock:
            self._tables.pop(table_id, None)
            for key in [k for k in self._order if k[0] == table_id]:
                self.held -= self._order.pop(key)


_RESIDENT = _Resident()


class _Deferred(Mapping[str, AnyArray]):
    """A step table's columns, each read from ``src`` on first access and kept while the
    process's deferred tables fit ``RESIDENT_BYTES`` together (the least recently used
    column of any of them is dropped first and read again when asked for: same values, a
    new array)."""

    __slots__ = ("_src", "_names", "_got", "__weakref__")

    def __init__(self, src: CachedColumns, names: list[str],
                 got: dict[str, AnyArray]) -> None:
        self._src = src
        self._names = names
        self._got: dict[str, AnyArray] = {}
        for k, v in got.items():
            self._got[k] = v
            _RESIDENT.add(self, k, _cost(v))

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
            _RESIDENT.touch(self, name)
            return got
        if name not in self._names:
            raise KeyError(name)
        got = self._load(name)
        self._got[name] = got
        _RESIDENT.add(self, name, _cost(got))
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
