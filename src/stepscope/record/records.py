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
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..schema import NAN_MEANS_MISSING, STEP_COLUMN_NAMES, AnyArray

__all__ = ["UNSET", "RowLayout", "rows_to_records", "encode_nonfinite", "encode_value"]

# Marks a slot nothing was recorded in. Distinct from NaN so that a NaN the training
# produced (loss=nan) is written as "NaN" and not confused with "not measured".
UNSET = -sys.float_info.max


# Phase names accepted by Step.phase / Recorder.add_time / record_step, and their columns.
PHASE_COLUMNS = {
    "data": "data_wait_s", "data_wait": "data_wait_s", "forward": "forward_s",
    "backward": "backward_s", "optimizer": "optimizer_s", "comm": "comm_s",
    "comm_exposed": "comm_exposed_s", "tool": "tool_s",
}
MAX_EXTRA = 32  # metrics beyond the schema's columns, per recorder


class RowLayout:
    """Which slot of a row holds which column: the schema's, then extras on first use."""

    def __init__(self) -> None:
        self.names: list[str] = list(STEP_COLUMN_NAMES)
        self.slots: dict[str, int] = {n: i for i, n in enumerate(self.names)}
        self.blank = [UNSET] * (len(self.names) + MAX_EXTRA)
        self._phases = {p: self.slots[c] for p, c in PHASE_COLUMNS.items()}

    def slot(self, name: str) -> int:
        """The slot of column ``name`` (added as an extra); -1 once extras are full."""
        col = self.slots.get(name)
        if col is None:
            if len(self.names) - len(STEP_COLUMN_NAMES) >= MAX_EXTRA:
                warnings.warn(f"stepscope: more than {MAX_EXTRA} extra metrics; "
                              f"dropping {name!r}", RuntimeWarning, stacklevel=4)
                self.slots[name] = -1
                return -1
            col = self.slots[name] = len(self.names)
            self.names.append(name)
        return col

    def phase_slot(self, phase: str) -> int:
        """The slot of a phase's seconds (``forward`` -> ``forward_s``, any name -> +_s)."""
        col = self._phases.get(phase)
        return self.slot(f"{phase}_s") if col is None else col

    def set_values(self, row: list[float], values: Mapping[str, Any]) -> None:
        slots = self.slots
        for k, v in values.items():
            col = slots.get(k)
            if col is None:
                col = self.slot(k)
            if col >= 0:
                row[col] = v  # converted to float by the writer, off the hot path

    def add_phases(self, row: list[float], phases: Mapping[str, float]) -> None:
        for name, seconds in phases.items():
            col = self.phase_slot(name)
            if col >= 0:
                v = row[col]
                row[col] = seconds if v == UNSET else v + seconds


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
