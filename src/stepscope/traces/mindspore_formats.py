"""Declarative mappings of MindSpore profiler files to event-table columns, and their readers.

One ``Field`` table per format (raw key -> column, converter, default when absent or
unparsable); the readers below apply them row by row into a ``Builder`` that converts each
column to numpy once. See ``traces/mindspore.py`` for which file is used when.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson

from ..errors import TraceFormatError
from ..schema import EVENT_KINDS, EventTable
from .mindspore_phases import is_comm_op

__all__ = [
    "Field", "Builder", "read_trace_view", "read_cpu_op_timestamps", "read_kernel_details",
    "read_step_trace", "read_communication", "TRACE_VIEW_FIELDS", "TRACE_VIEW_PROCESSES",
    "CPU_OP_TIMESTAMP_FIELDS", "KERNEL_DETAILS_FIELDS", "STEP_TRACE_FIELDS",
    "COMMUNICATION_FIELDS",
]

# Rebase origin granularity: 1e9 us (~17 min) keeps residuals < 1e9 us, where float64 still
# resolves 1e-7 us, and makes ranks of one job (started within seconds) share the origin.
_ORIGIN_QUANTUM_US = 1_000_000_000


@dataclass(frozen=True)
class Field:
    """One raw key of a format: where it goes, how to convert it, the value when absent."""

    raw: str
    column: str
    convert: Callable[[Any], Any]
    default: Any


def _num(x: Any) -> float:
    return float(str(x).strip())


def _int(x: Any) -> int:
    return int(float(str(x).strip()))


# -- trace_view.json ------------------------------------------------------------------
TRACE_VIEW_FIELDS: tuple[Field, ...] = (
    Field("name", "name", str, ""),
    Field("ts", "start_us", str, ""),  # string, epoch us: parsed exactly by _rebase
    Field("dur", "dur_us", _num, 0.0),
    Field("tid", "stream", _int, 0),
    Field("pid", "pid", _int, 0),
)
# Process name (``ph: M``, ``process_name``) -> what its X events are. "op": an operator,
# kind by name (compute or comm); "comm": communication; None: derived rows we skip
# ("Scope Layer" repeats the op scopes as spans; "Overlap Analysis" is MindSpore's own
# summary of the same kernels; CANN/AscendCL are host API calls). Names from MindSpore
# 2.10 CPU output (../shared/data/traces/mindspore-cpu) and its Ascend trace viewer.
TRACE_VIEW_PROCESSES: dict[str, str | None] = {
    "CPU OP": "op",
    "Ascend Hardware": "op",
    "HCCL": "comm",
    "Communication": "comm",
    "Scope Layer": None,
    "Overlap Analysis": None,
    "CANN": None,
    "AscendCL": None,
}

# -- cpu_op_execute_timestamp_{rank}.txt: one op per line ------------------------------
# name;type;occurrences  with each occurrence "start_ns,dur_ms,tid" (space separated).
CPU_OP_TIMESTAMP_FIELDS: tuple[Field, ...] = (
    Field("0", "name", str, ""),
    Field("2.start_ns", "start_us", int, 0),  # ns -> us in _rebase_ns
    Field("2.dur_ms", "dur_us", lambda v: float(v) * 1000.0, 0.0),
    Field("2.tid", "stream", _int, 0),
)

# -- kernel_details.csv ------------------------------------------------------------------
KERNEL_DETAILS_FIELDS: tuple[Field, ...] = (
    Field("Name", "name", str, ""),
    Field("Type", "op_type", str, ""),
    Field("Start Time(us)", "start_us", str, ""),
    Field("Duration(us)", "dur_us", _num, 0.0),
    Field("Wait Time(us)", "wait_us", _num, math.nan),
    Field("Stream ID", "stream", _int, 0),
    Field("Step Id", "step", _int, -1),
)

# -- step_trace_time.csv: per-step summary (us), kept in meta["step_trace"] ---------------
STEP_TRACE_FIELDS: tuple[Field, ...] = (
    Field("Step", "step", _int, -1),
    Field("Computing", "computing_us", _num, math.nan),
    Field("Communication(Not Overlapped)", "comm_exposed_us", _num, math.nan),
    Field("Overlapped", "overlapped_us", _num, math.nan),
    Field("Communication", "comm_us", _num, math.nan),
    Field("Free", "free_us", _num, math.nan),
    Field("Stage", "stage_us", _num, math.nan),
    Field("Bubble", "bubble_us", _num, math.nan),
    Field("Preparing", "preparing_us", _num, math.nan),
)

# -- communication.json: {"step<N>": {"collective"|"p2p": {op: {"Communication Time Info": {..}}}}}
COMMUNICATION_FIELDS: tuple[Field, ...] = (
    Field("Start Timestamp(us)", "start_us", str, ""),
    Field("Elapse Time(ms)", "dur_us", lambda v: float(v) * 1000.0, 0.0),
    Field("Wait Time(ms)", "wait_us", lambda v: float(v) * 1000.0, math.nan),
    Field("Transit Time(ms)", "transit_us", lambda v: float(v) * 1000.0, math.nan),
    Field("Synchronization Time(ms)", "sync_us", lambda v: float(v) * 1000.0, math.nan),
)

def _convert(fields: Sequence[Field], raw: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields:
        v = raw.get(f.raw)
        if v is None or (isinstance(v, str) and not v.strip()):
            out[f.column] = f.default
            continue
        try:
            out[f.column] = f.convert(v)
        except (TypeError, ValueError):
            out[f.column] = f.default
    return out


def _split_us(ts: str) -> tuple[int, float]:
    """'1796028313745211.164' -> (1796028313745211, 0.164): exact integer part."""
    s = ts.strip()
    if "." in s:
        a, b = s.split(".", 1)
        return int(a or 0), float("0." + b) if b else 0.0
    if "e" in s.lower():
        v = float(s)
        return int(v), v - int(v)
    return int(s), 0.0


class Builder:
    """Accumulates events in Python lists of scalars, then one numpy conversion per column."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.names: dict[str, int] = {}
        self.kind: list[int] = []
        self.name: list[int] = []
        self.start_int: list[int] = []  # whole us (or ns when ns=True) since epoch
        self.start_frac: list[float] = []
        self.dur: list[float] = []
        self.stream: list[int] = []
        self.step: list[int] = []
        self.extra: dict[str, list[float]] = {}
        self.op_types: dict[str, str] = {}  # name -> op type, where the format says it

    def add(self, kind: str, name: str, whole: int, frac: float, dur: float, stream: int,
            step: int = -1, **extra: float) -> None:
        idx = self.names.setdefault(name, len(self.names))
        self.kind.append(EVENT_KINDS.index(kind))
        self.name.append(idx)
        self.start_int.append(whole)
        self.start_frac.append(frac)
        self.dur.append(dur)
        self.stream.append(stream)
        self.step.append(step)
        n = len(self.kind)
        for k, v in extra.items():
            col = self.extra.setdefault(k, [math.nan] * (n - 1))
            col.append(v)
        for col in self.extra.values():
            if len(col) < n:
                col.append(math.nan)

    def extend(self, kinds: list[int], names: list[str], whole: list[int], frac: list[float],
               dur: list[float], stream: list[int]) -> None:
        """Bulk ``add`` of events without step or extra columns (kinds: EVENT_KINDS index)."""
        index = self.names
        self.name.extend([index.setdefault(n, len(index)) for n in names])
        self.kind.extend(kinds)
        self.start_int.extend(whole)
        self.start_frac.extend(frac)
        self.dur.extend(dur)
        self.stream.extend(stream)
        self.step.extend([-1] * len(kinds))
        n = len(self.kind)
        for col in self.extra.values():
            col.extend([math.nan] * (n - len(col)))

    def build(self, rank: int, meta: dict[str, Any]) -> EventTable:
        whole = np.asarray(self.start_int, dtype=np.int64)
        origin = int(whole.min() // _ORIGIN_QUANTUM_US * _ORIGIN_QUANTUM_US) if whole.size else 0
        start = (whole - origin).astype(np.float64) + np.asarray(self.start_frac, np.float64)
        n = len(self.kind)
        meta = {**meta, "time_origin_us": origin, "source": self.source, "device": "cpu"
                if "cpu_op" in self.source or "trace_view" in self.source else "npu"}
        return EventTable(
            rank=np.full(n, rank, dtype=np.int64),
            kind=np.asarray(self.kind, dtype=np.int8),
            name=np.asarray(self.name, dtype=np.int64),
            start_us=start,
            dur_us=np.asarray(self.dur, dtype=np.float64),
            stream=np.asarray(self.stream, dtype=np.int64),
            step=np.asarray(self.step, dtype=np.int64),
            names=list(self.names),
            extra={k: np.asarray(v, dtype=np.float64) for k, v in self.extra.items()},
            meta=meta,
        )


def _op_kind(name: str) -> str:
    return "comm" if is_comm_op(name) else "compute"


# -- format readers ------------------------------------------------------------------------
def _load_json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise TraceFormatError(
            f"{path}: not valid JSON ({exc}); expected a MindSpore profiler file. The file "
            "may be truncated: re-run the profiler's analysis or pass a complete directory"
        ) from exc
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read ({exc})") from exc


# Decoder generated from the field table: msgspec fills only the mapped keys (plus "ph" and
# "args", which only metadata rows carry on CPU) and skips the rest: no per-event dict.
_TV_KEYS: tuple[str, ...] = ("ph", "args", *(f.raw for f in TRACE_VIEW_FIELDS))
_TraceViewEvent = msgspec.defstruct("_TraceViewEvent", [(k, Any, None) for k in _TV_KEYS])
_TV_DECODER = msgspec.json.Decoder(list[_TraceViewEvent])  # type: ignore[valid-type]


_VECTOR_TYPES: dict[Callable[[Any], Any], type] = {_num: np.float64, _int: np.int64}


def _trace_view_events(path: Path) -> list[Any]:
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read ({exc})") from exc
    try:
        return _TV_DECODER.decode(data)
    except msgspec.ValidationError:
        pass  # valid JSON of another shape ({"traceEvents": [...]}, odd rows): generic path
    except msgspec.DecodeError as exc:
        raise TraceFormatError(
            f"{path}: not valid JSON ({exc}); expected a MindSpore profiler file. The file "
            "may be truncated: re-run the profiler's analysis or pass a complete directory"
        ) from exc
    obj = _load_json(path)
    if isinstance(obj, dict):
        obj = obj.get("traceEvents")
    if not isinstance(obj, list):
        raise TraceFormatError(
            f"{path}: expected a JSON array of Chrome-trace events (MindSpore trace_view.json), "
            f"found {type(obj).__name__}")
    return [_TraceViewEvent(**{k: e.get(k) for k in _TV_KEYS}) for e in obj
            if isinstance(e, dict)]


def _process_roles(events: list[Any]) -> dict[int, str | None]:
    roles: dict[int, str | None] = {}
    for e in events:
        if e.ph == "M" and e.name == "process_name" and isinstance(e.args, dict):
            try:
                roles[_int(e.pid)] = TRACE_VIEW_PROCESSES.get(str(e.args.get("name", "")))
            except (TypeError, ValueError):
                continue
    return roles


def _column(f: Field, values: list[Any]) -> list[Any]:
    """One mapped column: numbers in one numpy conversion when every value parses, else
    value by value (the field's default where a value is missing or bad)."""
    dtype = _VECTOR_TYPES.get(f.convert)
    if dtype is not None:
        try:
            return np.asarray(values, dtype=dtype).tolist()  # type: ignore[no-any-return]
        except (TypeError, ValueError, OverflowError):
            pass
    out = []
    for v in values:
        if v is None or (isinstance(v, str) and not v.strip()):
            out.append(f.default)
            continue
        try:
            out.append(f.convert(v))
        except (TypeError, ValueError):
            out.append(f.default)
    return out


def read_trace_view(path: Path, b: Builder) -> int:
    """Adds the op events of trace_view.json to ``b``; returns how many rows were skipped
    (rows of derived processes such as "Scope Layer", and rows without a usable time)."""
    events = _trace_view_events(path)
    roles = _process_roles(events)
    xs = [e for e in events if e.ph == "X"]
    cols = {f.column: _column(f, [getattr(e, f.raw) for e in xs]) for f in TRACE_VIEW_FIELDS}
    whole: list[int] = []
    frac: list[float] = []
    keep: list[int] = []
    for i, (pid, ts) in enumerate(zip(cols["pid"], cols["start_us"], strict=True)):
        if roles.get(pid) is None or not ts:
            continue
        try:
            w, f = _split_us(ts)
        except ValueError:
            continue
        whole.append(w)
        frac.append(f)
        keep.append(i)
    names = [str(cols["name"][i]) for i in keep]
    comm = EVENT_KINDS.index("comm")
    kind_of = {n: comm if is_comm_op(n) else EVENT_KINDS.index("compute") for n in set(names)}
    kinds = [comm if roles.get(cols["pid"][i]) == "comm" else kind_of[n]
             for i, n in zip(keep, names, strict=True)]
    b.extend(kinds, names, whole, frac, [cols["dur_us"][i] for i in keep],
             [cols["stream"][i] for i in keep])
    return len(xs) - len(keep)


def _parse_occurrence(occ: str) -> dict[str, str]:
    start, dur, tid = (occ.split(",") + ["", "", ""])[:3]
    return {"2.start_ns": start, "2.dur_ms": dur, "2.tid": tid or "0"}


def read_cpu_op_timestamps(path: Path, b: Builder) -> int:
    try:
        text = path.read_text(errors="replace")
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read ({exc})") from exc
    skipped = 0
    for line in text.splitlines():
        parts = line.strip().split(";")
        if len(parts) < 3:
            skipped += bool(line.strip())
            continue
        name = parts[0]
        for occ in parts[2].split():
            r = _convert(CPU_OP_TIMESTAMP_FIELDS, {"0": name, **_parse_occurrence(occ)})
            if r["start_us"] <= 0:
                skipped += 1
                continue
            ns = int(r["start_us"])
            b.add(_op_kind(name), name, ns // 1000, (ns % 1000) / 1000.0, r["dur_us"],
                  r["stream"])
    return skipped


def _csv_rows(path: Path) -> Iterator[dict[str, Any]]:
    try:
        with path.open(newline="", errors="replace") as f:
            yield from csv.DictReader(f)
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read ({exc})") from exc


def read_kernel_details(path: Path, b: Builder) -> int:
    skipped = 0
    for raw in _csv_rows(path):
        raw = {k.strip(): v for k, v in raw.items() if k}
        if "Step ID" in raw and "Step Id" not in raw:
            raw["Step Id"] = raw["Step ID"]
        r = _convert(KERNEL_DETAILS_FIELDS, raw)
        try:
            whole, frac = _split_us(r["start_us"])
        except ValueError:
            skipped += 1
            continue
        kind = "comm" if is_comm_op(r["name"]) or is_comm_op(r["op_type"]) else "compute"
        if r["op_type"]:
            b.op_types[r["name"]] = r["op_type"]
        b.add(kind, r["name"], whole, frac, r["dur_us"], r["stream"], r["step"],
              wait_us=r["wait_us"])
    return skipped


def read_step_trace(path: Path) -> dict[str, list[float]]:
    cols: dict[str, list[float]] = {f.column: [] for f in STEP_TRACE_FIELDS}
    for raw in _csv_rows(path):
        r = _convert(STEP_TRACE_FIELDS, {k.strip(): v for k, v in raw.items() if k})
        for k, v in r.items():
            cols[k].append(v)
    return cols


def read_communication(path: Path, b: Builder) -> int:
    data = _load_json(path)
    if not isinstance(data, dict):
        raise TraceFormatError(f"{path}: expected a JSON object keyed by step "
                               f"(MindSpore communication.json), found {type(data).__name__}")
    skipped = 0
    for step_key, groups in data.items():
        digits = re.sub(r"\D", "", str(step_key))
        step = int(digits) if digits else -1
        for group in (groups or {}).values() if isinstance(groups, dict) else ():
            for op, info in (group or {}).items() if isinstance(group, dict) else ():
                t = info.get("Communication Time Info") if isinstance(info, dict) else None
                r = _convert(COMMUNICATION_FIELDS, t if isinstance(t, dict) else {})
                try:
                    whole, frac = _split_us(r.pop("start_us"))
                except ValueError:
                    skipped += 1
                    continue
                b.add("comm", str(op), whole, frac, r.pop("dur_us"), -1, step, **r)
    return skipped
