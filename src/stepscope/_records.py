"""Formatting of step records, done by the recorder's writer thread, off the hot path.

The training thread fills plain lists (one slot per column, ``UNSET`` where nothing was
recorded); :func:`rows_to_records` turns a batch of them into the dicts written as JSON
lines. Pure and framework-free.

Example::

    rows_to_records([[0, 3, 0.5, UNSET]], ["rank", "step", "step_time_s", "loss"])
    # [{"rank": 0, "step": 3, "step_time_s": 0.5}]
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from .schema import NAN_MEANS_MISSING, AnyArray

__all__ = ["UNSET", "rows_to_records", "encode_nonfinite", "encode_value"]

# Marks a slot nothing was recorded in. Distinct from NaN so that a NaN the training
# produced (loss=nan) is written as "NaN" and not confused with "not measured".
UNSET = -sys.float_info.max


def encode_nonfinite(v: float) -> str:
    """JSON has no NaN/inf: write them as the strings readers map back (store.py)."""
    return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")


def encode_value(name: str, value: Any) -> float | str | None:
    """One value as written: None when it is not recorded (not a number, or a NaN in a
    column where NaN only means "not known"), else the float or its non-finite string."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    if math.isfinite(f):
        return f
    if f != f and name in NAN_MEANS_MISSING:
        return None
    return encode_nonfinite(f)


def _as_float_rows(rows: Sequence[Sequence[Any]]) -> AnyArray:
    """Rows to a float64 matrix; values that are not numbers (bad input) become UNSET."""
    try:
        return np.asarray(rows, dtype=np.float64)
    except (TypeError, ValueError):
        def num(v: Any) -> float:
            try:
                return float(v)
            except (TypeError, ValueError):
                return UNSET

        return np.asarray([[num(v) for v in r] for r in rows], dtype=np.float64)


def rows_to_records(rows: Sequence[Sequence[Any]], names: Sequence[str]
                    ) -> list[dict[str, Any]]:
    """Records (column name -> value) of the recorded slots of each row.

    Vectorised: the columns used in the batch are found once, then each record is built
    from those few columns only (a step touches ~12 of ~54 slots). ``rank`` and ``step``
    are written as integers, non-finite values as "NaN"/"Infinity"/"-Infinity" -- except a
    NaN in a column of ``NAN_MEANS_MISSING``, which is left out as not recorded.
    """
    if not rows:
        return []
    arr = _as_float_rows(rows)[:, : len(names)]
    missing_if_nan = np.array([n in NAN_MEANS_MISSING for n in names])
    present = (arr != UNSET) & ~(np.isnan(arr) & missing_if_nan)
    cols = np.flatnonzero(present.any(axis=0))
    keys = [names[c] for c in cols]
    sub = arr[:, cols]
    pres = present[:, cols]
    finite = np.isfinite(sub)
    if pres.all() and finite.all():
        out = [dict(zip(keys, r, strict=True)) for r in sub.tolist()]
    else:
        out = [{k: (v if f else encode_nonfinite(v))
                for k, v, p, f in zip(keys, r, ps, fs, strict=True) if p}
               for r, ps, fs in zip(sub.tolist(), pres.tolist(), finite.tolist(),
                                    strict=True)]
    for rec in out:
        rec["rank"] = int(rec["rank"])
        rec["step"] = int(rec["step"])
    return out
