"""Array helpers that stay O(n) on ten-million-row step tables (no sort where none is needed).

``np.unique`` sorts: ~9 s for the 9.6 million step numbers of a 64-rank, 150,000-step run on
a shared 2-core host, and the analyses ask for the unique steps or ranks many times. Step
and rank numbers are small, dense integers, so a presence table over their span gives the
same answer without a sort. :func:`unique_ints` returns exactly what ``np.unique`` returns
(and falls back to it for sparse or non-integer input). :class:`LastResult` remembers one
function's last result for the same input arrays (by identity), so that the several
analyses of one command that need e.g. the steady-state mask of one table compute it once.

Example::

    steps, inv = unique_ints(table["step"], return_inverse=True)
    is_ordered(table["rank"], table["step"])     # True for the store's tables
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

__all__ = ["unique_ints", "is_ordered", "nansum", "LastResult"]

# A presence table is used when the values span at most this many slots per value (plus a
# constant): beyond it (sparse step numbers) ``np.unique``'s sort is the cheaper one.
_SPAN_PER_VALUE = 4
_SPAN_SLACK = 1 << 16

T = TypeVar("T")
AnyArray = npt.NDArray[Any]


def unique_ints(x: AnyArray, *, return_inverse: bool = False,
                return_index: bool = False) -> Any:
    """``np.unique(x, return_index=..., return_inverse=...)`` for a 1-D array, equal to it.

    Integer arrays of a dense span are done in O(n) with a presence table; anything else
    is handed to ``np.unique``. Returns the unique values, then (when asked) the index of
    each one's first occurrence, then the inverse, as ``np.unique`` orders them.
    """
    x = np.asarray(x)
    dense = x.ndim == 1 and x.dtype.kind in "iu" and x.size > 0
    if dense and is_ordered(x):  # sorted (a store table's ranks): runs, no presence table
        new = np.empty(x.size, dtype=bool)
        new[0] = True
        np.not_equal(x[1:], x[:-1], out=new[1:])
        starts = np.flatnonzero(new)
        got: list[Any] = [x[starts]]
        if return_index:
            got.append(starts)
        if return_inverse:
            got.append(np.cumsum(new, dtype=np.intp) - 1)
        return got[0] if len(got) == 1 else tuple(got)
    lo = int(x.min()) if dense else 0
    span = int(x.max()) - lo + 1 if dense else 0
    if not dense or span > _SPAN_PER_VALUE * x.size + _SPAN_SLACK:
        return _np_unique(x, return_index, return_inverse)
    off = (x - lo).astype(np.intp, copy=False)
    present = np.zeros(span, dtype=bool)
    present[off] = True
    slots = np.flatnonzero(present)
    uniq = (slots + lo).astype(x.dtype, copy=False)
    out: list[Any] = [uniq]
    if return_index:
        first = np.full(span, x.size, dtype=np.intp)
        np.minimum.at(first, off, np.arange(x.size, dtype=np.intp))
        out.append(first[slots])
    if return_inverse:
        lookup = np.cumsum(present, dtype=np.intp) - 1
        out.append(lookup[off])
    return out[0] if len(out) == 1 else tuple(out)


def _same(x: Any, y: Any) -> bool:
    return x is y or (type(x) is type(y) and type(x) in (int, float, str) and x == y)


# Rows per pass of the order checks: the boolean temporaries of a pass stay in cache, where
# ``np.diff`` of a whole 2-million-row column made two 16 MB arrays at every call.
_ORDER_CHUNK = 1 << 16


def is_ordered(rank: AnyArray, step: AnyArray | None = None, strict: bool = False) -> bool:
    """True when the rows are ordered by (rank, step) (``strict``: no repeated pair), or by
    rank alone (non-decreasing) when ``step`` is None."""
    n = rank.size
    for lo in range(0, n - 1, _ORDER_CHUNK):
        hi = min(n, lo + _ORDER_CHUNK + 1)
        r0, r1 = rank[lo:hi - 1], rank[lo + 1:hi]
        if step is None:
            ok = r1 >= r0
        else:
            s0, s1 = step[lo:hi - 1], step[lo + 1:hi]
            ok = (s1 > s0) if strict else (s1 >= s0)
            ok &= r1 == r0
            ok |= r1 > r0
        if not ok.all():
            return False
    return True


def nansum(x: AnyArray) -> float:
    """``float(np.nansum(x))`` of a 1-D float column. With no NaN in it, ``np.sum`` of the
    column itself: nansum sums a copy with NaN set to 0 (8 bytes a row, a fresh 16 MB
    array for a 2-million-row column), and the same values in the same layout sum to the
    same float."""
    if x.ndim == 1 and x.dtype == np.float64 and x.flags.c_contiguous \
            and not np.isnan(x).any():
        return float(np.sum(x))
    return float(np.nansum(x))


def _np_unique(x: AnyArray, index: bool, inverse: bool) -> Any:
    fn: Any = np.unique  # its overloads cannot type a flag passed through
    return fn(x, return_index=index, return_inverse=inverse)


class LastResult(Generic[T]):
    """The last results of ``fn(*keys, *rest)``, reused while the same keys come again.

    ``keys`` (arrays, tables) are matched by identity through weak references (a result
    never keeps a table alive, and a new object at a reused address is never mistaken for
    the old one); ``rest`` by identity too, numbers and strings by value (an int past
    256 is a new object each time it is computed). ``entries``: how many are kept, the most
    recently used first (one: a command analyses one table at a time; two where it
    alternates between two, as ``compare`` does). Callers must not modify a result
    (masks are returned read-only).
    """

    def __init__(self, fn: Callable[..., T], entries: int = 1) -> None:
        self._fn = fn
        self._entries = entries
        self._kept: list[tuple[tuple[weakref.ref[Any], ...], tuple[Any, ...], T]] = []

    def __call__(self, arrays: tuple[Any, ...], rest: tuple[Any, ...] = ()) -> T:
        for i, (refs, args, result) in enumerate(self._kept):
            if (len(refs) == len(arrays)
                    and all(r() is a for r, a in zip(refs, arrays, strict=True))
                    and len(args) == len(rest)
                    and all(_same(x, y) for x, y in zip(args, rest, strict=True))):
                self._kept.insert(0, self._kept.pop(i))
                return result
        result = self._fn(*arrays, *rest)
        self._kept = [(tuple(weakref.ref(a) for a in arrays), rest, result),
                      *self._kept[:self._entries - 1]]
        return result
