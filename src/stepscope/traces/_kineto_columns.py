"""Column building for the Kineto reader: raw events (one chunk at a time) -> numpy columns.

Private: :mod:`stepscope.traces.kineto` owns the format tables and passes them in, so this
module holds no format knowledge of its own besides linking (launch <-> kernel, step).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from operator import attrgetter
from pathlib import Path
from typing import Any, Protocol

import msgspec
import numpy as np
import numpy.typing as npt
from numpy.typing import NDArray

from ..errors import TraceFormatError
from ..schema import EVENT_KINDS, EventTable

_EMPTY: dict[str, Any] = {}
_STEP_NUM_RE = re.compile(r"ProfilerStep\s*#\s*(\d+)")
_RANK_IN_NAME_RE = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)
_INT64_MAX = 2**63 - 1
# Longest plausible event: 1e11 µs = 27.8 h, beyond any profiler capture window (a
# capture is a few steps; a whole run's trace is hours). Larger is corruption (1e300).
MAX_DUR_US = 1e11


class _FieldLike(Protocol):
    @property
    def raw(self) -> str: ...
    @property
    def column(self) -> str: ...
    @property
    def default(self) -> Any: ...


Classifier = Callable[[str, str, bool], "tuple[str, bool]"]


def hta_int(value: Any) -> int:
    """``int(value)`` as HTA 0.5.0 applies it to ``args.stream``; -1 when that fails."""
    try:
        out = int(value)
    except (ValueError, TypeError, OverflowError):
        return -1
    return out if -_INT64_MAX <= out <= _INT64_MAX else -1


def _ints(values: list[Any], fallback: Callable[[Any], int]) -> npt.NDArray[np.int64]:
    try:
        return np.array(values, dtype=np.int64)
    except (ValueError, TypeError, OverflowError):
        return np.fromiter((fallback(v) for v in values), dtype=np.int64, count=len(values))


def _floats(values: list[Any], what: str, path: Path) -> npt.NDArray[np.float64]:
    try:
        return np.array(values, dtype=np.float64)
    except (ValueError, TypeError, OverflowError):
        pass
    out = np.empty(len(values), dtype=np.float64)
    for i, v in enumerate(values):
        try:
            out[i] = float(v)
        except (ValueError, TypeError, OverflowError):
            raise TraceFormatError(
                f"{path}: an event's '{what}' is {v!r}; expected a number of microseconds. "
                "The trace is corrupt or not a PyTorch profiler trace.") from None
    return out


class _Accumulator:
    """Collects columns chunk by chunk; ``finish`` links and returns the EventTable."""

    def __init__(self, path: Path, event_fields: Sequence[_FieldLike],
                 arg_fields: Sequence[_FieldLike], classify: Classifier,
                 no_args: Any = None) -> None:
        self.path = path
        self.keys = [f.raw for f in event_fields]
        self.columns = [f.column for f in event_fields]
        self.defaults = [f.default for f in event_fields]
        self.arg_keys = [f.raw for f in arg_fields]
        self.arg_columns = [f.column for f in arg_fields]
        self.no_args = no_args  # the struct decoder's args object with every default
        self.arg_defaults = [f.default for f in arg_fields]
        self.classify = classify
        self.names: dict[str, int] = {}
        self.cats: dict[str, int] = {}
        self.parts: list[tuple[NDArray[Any], ...]] = []
        self.meta: dict[str, Any] = {"path": str(path), "format": "kineto",
                                     "ts_is_float": False, "skipped_events": 0}
        self.thread_names: dict[int, str] = {}
        self.str_ids: dict[str, int] = {}

    # ------------------------------------------------------------------ intake
    def header(self, doc: dict[str, Any]) -> None:
        if not isinstance(doc, dict):
            return
        info = doc.get("distributedInfo")
        if isinstance(info, dict):
            self.meta["distributed_info"] = info
        props = doc.get("deviceProperties")
        if isinstance(props, list):
            self.meta["device_names"] = [str(p.get("name")) for p in props
                                         if isinstance(p, dict) and "name" in p]

    def add(self, events: Any) -> None:
        """One chunk of raw events: msgspec structs (fast path) or plain dicts."""
        if not isinstance(events, list):
            raise TraceFormatError(f"{self.path}: 'traceEvents' is not an array of events")
        if events and isinstance(events[0], msgspec.Struct):
            self._add_structs(events)
        else:
            self._add_dicts(events)

    def _add_structs(self, events: list[Any]) -> None:
        for e in [e for e in events if e.ph == "M"]:
            if e.name == "thread_name" and e.args is not None:
                self._thread_name(e.tid, e.args.label)
        xs = [e for e in events if e.ph == "X"]
        kept = [e for e in xs if e.dur_us is not None]
        self.meta["skipped_events"] += len(xs) - len(kept)
        # map(attrgetter) runs in C; events without args get the defaults of the table.
        cols = {c: list(map(attrgetter(c), kept)) for c in self.columns}
        args = [a if a is not None else self.no_args for a in map(attrgetter("args"), kept)]
        stream, corr, coll = (list(map(attrgetter(c), args)) for c in self.arg_columns[:3])
        self._append(cols["start_us"], cols["dur_us"], cols["name"], cols["cat"],
                     cols["tid"], stream, corr, [c is not None for c in coll])

    def _add_dicts(self, events: list[Any]) -> None:
        k_ts, k_dur, k_name, k_cat, k_tid = self.keys
        d_ts, _, d_name, d_cat, d_tid = self.defaults
        a_stream, a_corr, a_coll, _ = self.arg_keys
        ad_stream, ad_corr, _, _ = self.arg_defaults
        ts: list[Any] = []
        dur: list[Any] = []
        name: list[Any] = []
        cat: list[Any] = []
        tid: list[Any] = []
        stream: list[Any] = []
        corr: list[Any] = []
        coll: list[bool] = []
        for e in events:
            if type(e) is not dict:
                raise TraceFormatError(
                    f"{self.path}: a trace event is a {type(e).__name__}, expected a JSON "
                    "object (Chrome trace format).")
            ph = e.get("ph")
            if ph != "X":
                if ph == "M" and e.get("name") == "thread_name":
                    args = e.get("args")
                    self._thread_name(e.get("tid", 0),
                                      args.get("name") if isinstance(args, dict) else None)
                continue
            d = e.get(k_dur)
            if d is None:
                self.meta["skipped_events"] += 1
                continue
            a = e.get("args")
            if type(a) is not dict:
                a = _EMPTY
            ts.append(e.get(k_ts, d_ts))
            dur.append(d)
            name.append(e.get(k_name, d_name))
            cat.append(e.get(k_cat, d_cat))
            tid.append(e.get(k_tid, d_tid))
            stream.append(a.get(a_stream, ad_stream))
            corr.append(a.get(a_corr, ad_corr))
            coll.append(a_coll in a)
        self._append(ts, dur, name, cat, tid, stream, corr, coll)

    def _intern(self, values: list[Any], table: dict[str, int]) -> list[int]:
        if set(map(type, values)) - {str}:
            values = [v if type(v) is str else str(v) for v in values]
        for v in dict.fromkeys(values):  # new strings get the next ids, in order
            if v not in table:
                table[v] = len(table)
        return list(map(table.__getitem__, values))

    def _append(self, ts: list[Any], dur: list[Any], name: list[Any], cat: list[Any],
                tid: list[Any], stream: list[Any], corr: list[Any], coll: list[bool]) -> None:
        if not ts:
            return
        types = set(map(type, ts))
        if float in types or not types <= {int, float}:
            self.meta["ts_is_float"] = True
        self.parts.append((
            _floats(ts, "ts", self.path), _floats(dur, "dur", self.path),
            np.array(self._intern(name, self.names), dtype=np.int64),
            np.array(self._intern(cat, self.cats), dtype=np.int16),
            _ints(tid, self._tid), _ints(stream, hta_int), _ints(corr, hta_int),
            np.array(coll, dtype=np.bool_),
        ))

    def _tid(self, value: Any) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value if abs(value) <= _INT64_MAX else -3
        key = str(value)
        digits = re.search(r"-?\d+", key)
        if digits and len(digits.group()) < 18:
            return int(digits.group())
        return -1000 - self.str_ids.setdefault(key, len(self.str_ids))

    def _thread_name(self, raw_tid: Any, label: Any) -> None:
        if not isinstance(label, str):
            return
        tid = self._tid(raw_tid)
        old = self.thread_names.get(tid)
        # The README of the CPU fixtures: gloo threads get a second "python3" name; keep the
        # first name that mentions gloo.
        if old is None or ("gloo" not in old and "gloo" in label):
            self.thread_names[tid] = label

    # ------------------------------------------------------------------ output
    def finish(self) -> EventTable:
        cols: list[NDArray[Any]] = [
            np.concatenate(c) for c in zip(*self.parts, strict=True)] if self.parts else [
            np.zeros(0, np.float64), np.zeros(0, np.float64), np.zeros(0, np.int64),
            np.zeros(0, np.int16), np.zeros(0, np.int64), np.zeros(0, np.int64),
            np.zeros(0, np.int64), np.zeros(0, np.bool_)]
        self.parts = []
        ts, dur, name, cat, tid, hstream, corr, coll = cols
        ok = np.isfinite(ts) & np.isfinite(dur)
        if not ok.all():
            self.meta["skipped_events"] += int((~ok).sum())
        bad = ok & ((dur < 0) | (dur > MAX_DUR_US))
        if bad.any():  # a negative or absurd duration would poison every share and total
            self.meta["rejected_durations"] = int(bad.sum())
            ok &= ~bad
        if not ok.all():
            ts, dur, name, cat, tid, hstream, corr, coll = (
                c[ok] for c in (ts, dur, name, cat, tid, hstream, corr, coll))
        names = list(self.names)
        categories = list(self.cats)
        kind, on_device = self._kinds(name, cat, coll, names, categories)
        stream = np.where(on_device & (hstream >= 0), hstream, tid)
        launch_idx = _launch_index(corr, on_device)
        launch_us = np.where(launch_idx >= 0, ts[np.maximum(launch_idx, 0)], np.nan)
        steps = _step_intervals(ts, dur, name, kind, on_device, names)
        step = _assign_steps(ts, on_device, launch_idx, steps)
        self.meta.update(
            categories=categories, thread_names=self.thread_names,
            comm_threads=sorted(t for t, n in self.thread_names.items() if "gloo" in n),
            steps={int(k): [float(s), float(d)] for k, s, d in zip(*steps, strict=True)},
        )
        rank = self._rank()
        self.meta["rank"] = rank
        return EventTable(
            rank=np.full(len(ts), rank, dtype=np.int64), kind=kind, name=name,
            start_us=ts, dur_us=dur, stream=stream.astype(np.int64), step=step, names=names,
            extra={"cat": cat, "correlation": corr, "hta_stream": hstream,
                   "on_device": on_device.astype(np.int8), "launch_us": launch_us},
            meta=self.meta,
        )

    def _kinds(self, name: NDArray[Any], cat: NDArray[Any], coll: NDArray[Any], names: list[str],
               categories: list[str]) -> tuple[npt.NDArray[np.int8], npt.NDArray[np.bool_]]:
        key = (cat.astype(np.int64) * (len(names) + 1) + name) * 2 + coll
        uniq, inverse = np.unique(key, return_inverse=True)
        kinds = np.empty(len(uniq), dtype=np.int8)
        dev = np.empty(len(uniq), dtype=np.bool_)
        for i, k in enumerate(uniq.tolist()):
            c, rest = divmod(k // 2, len(names) + 1)
            kd, od = self.classify(categories[c], names[rest], bool(k % 2))
            kinds[i], dev[i] = EVENT_KINDS.index(kd), od
        return kinds[inverse], dev[inverse]

    def _rank(self) -> int:
        info = self.meta.get("distributed_info")
        if isinstance(info, dict) and isinstance(info.get("rank"), int):
            return int(info["rank"])
        m = _RANK_IN_NAME_RE.search(self.path.name)
        return int(m.group(1)) if m else 0


def _launch_index(corr: NDArray[Any], on_device: NDArray[Any]) -> npt.NDArray[np.int64]:
    """For each device event, the row of its host launch (same correlation id), else -1."""
    out = np.full(len(corr), -1, dtype=np.int64)
    host = np.flatnonzero(~on_device & (corr >= 0))
    dev = np.flatnonzero(on_device & (corr >= 0))
    if not len(host) or not len(dev):
        return out
    order = np.argsort(corr[host], kind="stable")
    hc = corr[host][order]
    pos = np.searchsorted(hc, corr[dev])
    pos_c = np.minimum(pos, len(hc) - 1)
    hit = hc[pos_c] == corr[dev]
    out[dev[hit]] = host[order][pos_c[hit]]
    return out


def _step_intervals(ts: NDArray[Any], dur: NDArray[Any], name: NDArray[Any], kind: NDArray[Any],
                    on_device: NDArray[Any], names: list[str]
                    ) -> tuple[npt.NDArray[np.int64], NDArray[Any], NDArray[Any]]:
    rows = np.flatnonzero((kind == EVENT_KINDS.index("step")) & ~on_device)
    nums = []
    for i in rows.tolist():
        m = _STEP_NUM_RE.search(names[int(name[i])])
        nums.append(int(m.group(1)) if m else -1)
    order = np.argsort(ts[rows], kind="stable")
    rows = rows[order]
    return (np.array(nums, dtype=np.int64)[order] if nums else np.zeros(0, np.int64),
            ts[rows], dur[rows])


def _assign_steps(ts: NDArray[Any], on_device: NDArray[Any], launch_idx: NDArray[Any],
                  steps: tuple[NDArray[Any], NDArray[Any], NDArray[Any]]) -> npt.NDArray[np.int64]:
    """Host event: the ProfilerStep whose [start, end) holds its start (HTA's rule).
    Device event: the step of its launch (so GPU work that runs late stays in its step);
    by its own start time when the trace did not record the launch."""
    nums, starts, durs = steps
    step = np.full(len(ts), -1, dtype=np.int64)
    if not len(nums):
        return step
    pos = np.searchsorted(starts, ts, side="right") - 1
    inside = (pos >= 0) & (ts < (starts + durs)[np.maximum(pos, 0)])
    step[inside] = nums[pos[inside]]
    dev = on_device.astype(bool)
    linked = dev & (launch_idx >= 0)
    step[linked] = step[launch_idx[linked]]  # unlinked device events keep the time rule
    return step

