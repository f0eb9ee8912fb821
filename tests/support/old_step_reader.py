"""The step reader as it was before the columnar one (commit eed87b3): the oracle only.

Kept verbatim (ReadStats reduced to what it used) so the tests can compare every column,
NaN flag and skipped-line count of the new reader against it on run directories the
project itself writes. Not used by stepscope.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from stepscope.schema import STEP_COLUMN_NAMES, AnyArray, StepTable


@dataclass
class ReadStats:
    records: int = 0
    skipped: int = 0
    torn_tail: int = 0
    files: int = 0
    problems: list[str] = field(default_factory=list)

    def note(self, problem: str) -> None:
        self.skipped += 1
        if len(self.problems) < 20:
            self.problems.append(problem)


def _parse_jsonl(data: bytes, source: str, stats: ReadStats) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    lines = data.split(b"\n")
    last = len(lines) - 1
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError:
            if i == last:  # no newline after it: the writer died mid-line
                stats.torn_tail += 1
                stats.note(f"{source}: torn last line (partial write), skipped")
            else:
                stats.note(f"{source}:{i + 1}: corrupt record, skipped")
            continue
        if not isinstance(obj, dict):
            stats.note(f"{source}:{i + 1}: record is not a JSON object, skipped")
            continue
        rows.append(obj)
    return rows


# Non-finite values are written as these strings (JSON has no NaN/inf literals).
_NONFINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _is_value(v: Any) -> bool:
    return ((isinstance(v, (int, float)) and not isinstance(v, bool))
            or (isinstance(v, str) and v in _NONFINITE))


def _column(vals: list[Any]) -> tuple[AnyArray, AnyArray | None]:
    """Float column from record values, and a flag column where an explicit NaN was read."""
    out = np.empty(len(vals), dtype=np.float64)
    flags = None
    for i, v in enumerate(vals):
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            out[i] = v
        elif isinstance(v, str) and v in _NONFINITE:
            out[i] = _NONFINITE[v]
            if v == "NaN":
                if flags is None:
                    flags = np.zeros(len(vals), dtype=np.float64)
                flags[i] = 1.0
        else:  # None (not recorded) or a value of the wrong type
            out[i] = np.nan
    return out, flags


def _rows_to_table(rows: list[dict[str, Any]], source: str, stats: ReadStats) -> StepTable:
    names: dict[str, None] = dict.fromkeys(STEP_COLUMN_NAMES)
    good: list[dict[str, Any]] = []
    merged: dict[tuple[Any, Any], dict[str, Any]] = {}
    for i, r in enumerate(rows):
        if not isinstance(r.get("step"), int) or not isinstance(r.get("rank", 0), int):
            stats.note(f"{source}: record {i + 1} has no integer 'step'/'rank', skipped")
            continue
        for k in [k for k, v in r.items() if v is not None and not _is_value(v)]:
            r.pop(k)  # non-numeric values cannot live in a float column
        key = (r.get("rank", 0), r["step"])
        prev = merged.get(key)
        if prev is None:
            merged[key] = r
            good.append(r)
        else:  # a late record (values logged after the step closed): merge into it
            prev.update({k: v for k, v in r.items() if v is not None})
        names.update(dict.fromkeys(r))
    cols: dict[str, AnyArray] = {}
    for name in names:
        vals = [r.get(name) for r in good]
        if name in ("rank", "step"):
            cols[name] = np.array([v if v is not None else 0 for v in vals], dtype=np.int64)
            continue
        cols[name], flags = _column(vals)
        if flags is not None:
            cols[f"{name}_nan"] = flags
    stats.records += len(good)
    return StepTable(cols)



def old_read_steps(run: Path) -> tuple[StepTable, ReadStats]:
    stats = ReadStats()
    tables = []
    for f in sorted((run / "steps").glob("rank-*.jsonl")):
        stats.files += 1
        rows = _parse_jsonl(f.read_bytes(), f.name, stats)
        tables.append(_rows_to_table(rows, f.name, stats))
    return StepTable.concat(tables).sorted(), stats


def assert_tables_equal(new: StepTable, old: StepTable) -> None:
    """Same columns, dtypes and values (NaN equal to NaN) in the same row order."""
    assert set(new.columns) == set(old.columns)
    assert len(new) == len(old)
    for c in old.columns:
        assert new[c].dtype == old[c].dtype, c
        assert np.array_equal(new[c], old[c], equal_nan=True), c
