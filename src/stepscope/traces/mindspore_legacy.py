"""Readers for the MindSpore inputs that are not a ``*_ascend_ms`` directory.

* **msprof output** (CANN's own profiler, also what MindSpore's Ascend capture keeps under
  ``PROF_*``): a ``PROF_<n>_<timestamp>_<id>/`` directory with
  ``mindstudio_profiler_output/op_summary_*.csv`` (device tasks: ``OP_SUMMARY_FIELDS``) or,
  without it, ``mindstudio_profiler_output/msprof_*.json`` (a Chrome trace read like
  ``trace_view.json``). Older CANN releases put the same files under
  ``device_<id>/summary/`` and ``device_<id>/timeline/``. The rank is the device id
  (msprof does not know the job's rank), and ``meta["rank_source"]`` says so.
* **MindSpore's older profiler layout** (MindSpore <= 2.3, the MindInsight era): one flat
  ``profiler/`` directory with ``output_timeline_data_{rank}.txt`` (``op_name, stream_id,
  start_time, duration`` with the units in the header: ``start_time(us)`` on Ascend and
  GPU, ``start_time(ms)`` from the PyNative profiler; ``duration(ms)``) and, on CPU,
  ``cpu_op_execute_timestamp_{rank}.txt`` (the format the ``FRAMEWORK/`` folder still has).

The column names follow MindSpore 2.10's own constants for op_summary
(``mindspore/profiler/common/constant.py``: ``OpSummaryHeaders``) and the MindSpore docs'
description of the older files. No Ascend machine or old MindSpore exists here: these
formats are tested on files written to that layout (tests/data/*/NOTE.md says which).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from ..errors import TraceFormatError
from .mindspore_formats import (
    Builder,
    Field,
    _convert,
    _csv_rows,
    _int,
    _num,
    _split_us,
    read_cpu_op_timestamps,
    read_trace_view,
)
from .mindspore_phases import is_comm_op

__all__ = ["OP_SUMMARY_FIELDS", "is_msprof_dir", "is_legacy_dir", "msprof_rank",
           "legacy_rank", "read_msprof", "read_legacy", "MSPROF_OUTPUT"]

MSPROF_OUTPUT = "mindstudio_profiler_output"
_PROF_RE = re.compile(r"^PROF_\d+_\d+_[0-9a-zA-Z]+")  # MindSpore's CANN_FILE_REGEX
_DEVICE_RE = re.compile(r"^device_(\d+)$")
_LEGACY_RE = re.compile(r"^(?:output_timeline_data|cpu_op_execute_timestamp)_(\d+)\.txt$")

# -- op_summary_*.csv (msprof): one device task per row ----------------------------------
OP_SUMMARY_FIELDS: tuple[Field, ...] = (
    Field("Op Name", "name", str, ""),
    Field("OP Type", "op_type", str, ""),
    Field("Task Start Time(us)", "start_us", lambda v: str(v).strip().strip("\t"), ""),
    Field("Task Duration(us)", "dur_us", _num, 0.0),
    Field("Task Wait Time(us)", "wait_us", _num, math.nan),
    Field("Stream ID", "stream", _int, 0),
    Field("Step ID", "step", _int, -1),
    Field("Device_id", "device", _int, -1),
)


def is_msprof_dir(d: Path) -> bool:
    return bool(_PROF_RE.match(d.name)) and d.is_dir() and (
        (d / MSPROF_OUTPUT).is_dir() or any(_DEVICE_RE.match(c.name) for c in _dirs(d)))


def is_legacy_dir(d: Path) -> bool:
    try:
        return d.is_dir() and any(_LEGACY_RE.match(f.name) for f in d.iterdir())
    except OSError:
        return False


def _dirs(d: Path) -> list[Path]:
    try:
        return sorted(c for c in d.iterdir() if c.is_dir())
    except OSError:
        return []


def _msprof_files(d: Path, pattern: str, old_sub: str) -> list[Path]:
    found = sorted((d / MSPROF_OUTPUT).glob(pattern)) if (d / MSPROF_OUTPUT).is_dir() else []
    for dev in (c for c in _dirs(d) if _DEVICE_RE.match(c.name)):
        found += sorted((dev / old_sub).glob(pattern))
    return found


def msprof_rank(d: Path) -> int | None:
    """The device id of a ``PROF_*`` directory (its ``device_<id>`` folder)."""
    ids = [int(m.group(1)) for c in _dirs(d) if (m := _DEVICE_RE.match(c.name))]
    return ids[0] if len(ids) == 1 else None


def legacy_rank(d: Path) -> int | None:
    ids = {int(m.group(1)) for f in d.iterdir() if (m := _LEGACY_RE.match(f.name))}
    return ids.pop() if len(ids) == 1 else None


def _read_op_summary(path: Path, b: Builder) -> int:
    skipped = 0
    for raw in _csv_rows(path):
        r = _convert(OP_SUMMARY_FIELDS, {k.strip(): v for k, v in raw.items() if k})
        try:
            whole, frac = _split_us(r["start_us"])
        except ValueError:
            skipped += 1
            continue
        kind = "comm" if is_comm_op(r["name"]) or is_comm_op(r["op_type"]) \
            or r["name"].lower().startswith("hcom_") else "compute"
        if r["op_type"]:
            b.op_types[r["name"]] = r["op_type"]
        b.add(kind, r["name"], whole, frac, r["dur_us"], r["stream"], r["step"],
              wait_us=r["wait_us"])
    return skipped


def read_msprof(d: Path) -> tuple[Builder, int]:
    """Events of a ``PROF_*`` directory (op_summary first, else the msprof timeline)."""
    summaries = _msprof_files(d, "op_summary_*.csv", "summary")
    if summaries:
        b = Builder(str(summaries[0]))
        return b, sum(_read_op_summary(f, b) for f in summaries)
    timelines = _msprof_files(d, "msprof*.json", "timeline")
    if timelines:
        b = Builder(str(timelines[0]))
        return b, sum(read_trace_view(f, b) for f in timelines)
    raise TraceFormatError(
        f"{d}: msprof output without op_summary_*.csv or msprof_*.json under "
        f"{MSPROF_OUTPUT}/ (or device_*/summary, device_*/timeline); run `msprof "
        "--export=on --output=<PROF dir>` to export them")


_UNIT_US = {"us": 1.0, "ms": 1000.0, "ns": 1e-3, "s": 1e6}
_HEADER_UNIT = re.compile(r"(start_time|duration)\s*\((\w+)\)")


def _read_timeline_txt(path: Path, b: Builder) -> int:
    """``output_timeline_data_{rank}.txt``: a header naming the units, then
    ``name,stream,start,duration`` rows."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        raise TraceFormatError(f"{path}: cannot read ({exc})") from exc
    units = {"start_time": "us", "duration": "ms"}  # the Ascend/GPU writers' units
    if lines and not lines[0][:1].isdigit() and "op_name" in lines[0]:
        units.update(dict(_HEADER_UNIT.findall(lines.pop(0))))
    to_start, to_dur = _UNIT_US[units["start_time"]], _UNIT_US[units["duration"]]
    skipped = 0
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4:
            skipped += bool(line.strip())
            continue
        try:
            start, dur = float(parts[2]) * to_start, float(parts[3]) * to_dur
            stream = _int(parts[1]) if parts[1].lstrip("-").isdigit() else 0
        except ValueError:
            skipped += 1
            continue
        whole = int(start)
        b.add("comm" if is_comm_op(parts[0]) else "compute", parts[0], whole, start - whole,
              dur, stream)
    return skipped


def read_legacy(d: Path) -> tuple[Builder, int]:
    """Events of an older MindSpore ``profiler/`` directory."""
    timeline = sorted(d.glob("output_timeline_data_*.txt"))
    cpu = sorted(d.glob("cpu_op_execute_timestamp_*.txt"))
    if timeline:
        b = Builder(str(timeline[0]))
        return b, _read_timeline_txt(timeline[0], b)
    b = Builder(str(cpu[0]))
    return b, read_cpu_op_timestamps(cpu[0], b)
