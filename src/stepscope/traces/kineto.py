"""PyTorch profiler (Kineto) Chrome traces -> :class:`~stepscope.schema.EventTable`.

The whole format is described by three tables below: ``EVENT_FIELDS`` and ``ARG_FIELDS``
(raw key -> column, type, default), ``CATEGORY_KIND`` (Kineto ``cat`` -> event kind) and
``ANNOTATION_KIND`` (user-annotation name pattern -> kind). The decoder streams the file:
it inflates ``.gz`` in chunks, cuts the ``traceEvents`` array at event boundaries and
decodes each chunk in one pass with msgspec into structs generated from the field tables
(only mapped keys are materialised; call stacks, shapes and other args are skipped in C).
A chunk whose fields have unexpected types is decoded with orjson into dicts instead, and
a file the framing cannot cut is decoded whole. Only numpy columns and one string table
are kept, so memory is bounded by the columns, not by per-event Python objects.

Extra columns (``EventTable.extra``), all the length of the table:

- ``cat`` (int16): index into ``meta["categories"]`` (the raw Kineto ``cat``; ``""`` if none).
- ``correlation`` (int64): ``args.correlation`` (links a device event to its host launch), -1.
- ``hta_stream`` (int64): ``args.stream`` read the way HTA 0.5.0 reads it (``int(x)``, -1 when
  absent or not convertible); kept only to reproduce HTA's event selection.
- ``on_device`` (int8): 1 for events on an accelerator timeline (kernels, memcpy/memset,
  device sync, GPU-side annotations).
- ``launch_us`` (float64): start of the host launch (cudaLaunchKernel, hipLaunchKernel, ...)
  of a device event, NaN when it has none; start minus launch is the queue time.

``meta``: ``path``, ``format`` ("kineto"), ``categories``, ``ts_is_float`` (any raw ``ts``
was a JSON float: HTA then rounds inward to whole µs), ``device_names``,
``distributed_info``, ``thread_names`` ({tid: name}), ``comm_threads`` (gloo run-loop tids),
``steps`` ({step number: [start_us, dur_us]}), ``skipped_events``.

Example::

    from stepscope.traces import kineto
    table = kineto.read(Path("rank0.pt.trace.json.gz"))
    table.meta["steps"]        # {2: [5171818743758.9, 1093600.0], ...}
"""

from __future__ import annotations

import gzip
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Optional, cast

import msgspec
import orjson

from ..errors import TraceFormatError
from ..schema import EventTable
from ._kineto_columns import _Accumulator

__all__ = ["read", "looks_like", "EVENT_FIELDS", "ARG_FIELDS", "CATEGORY_KIND", "is_comm_kernel"]

# Decompressed bytes per decoding chunk: ~6k Kineto events (~320 B each); big enough that
# the per-call decode overhead vanishes, small enough that one chunk's objects stay ~10 MB.
CHUNK_BYTES = 2 << 20


@dataclass(frozen=True)
class Field:
    """One raw key of a trace event and the column it lands in."""

    raw: str
    column: str
    dtype: str
    default: Any
    doc: str


# Top-level keys of an ``"ph": "X"`` event (Chrome trace format, Kineto flavour).
EVENT_FIELDS: tuple[Field, ...] = (
    Field("ts", "start_us", "float64", math.nan, "start, µs; floats carry ns decimals"),
    Field("dur", "dur_us", "float64", None, "duration, µs; events without one are skipped"),
    Field("name", "name", "str", "", "op, kernel or annotation name"),
    Field("cat", "cat", "str", "", "Kineto category (cpu_op, kernel, user_annotation, ...)"),
    Field("tid", "tid", "int", 0, "host thread id, or device stream for device events"),
)
# Keys inside ``args``.
ARG_FIELDS: tuple[Field, ...] = (
    Field("stream", "hta_stream", "int", -1, "device stream of a device event"),
    Field("correlation", "correlation", "int", -1, "launch <-> device event link"),
    Field("Collective name", "collective", "str", None, "NCCL collective (newer Kineto)"),
    Field("name", "label", "str", None, "thread name (``ph: M`` thread_name events)"),
)

# Kineto ``cat`` -> (kind, on_device). Device sync waits (cuda_sync) are not work: kind "cpu"
# with on_device=1, so busy-time unions skip them (HTA instead counts "Stream Sync" as
# non-compute busy time; the --hta-compatible path reproduces that from the raw columns).
CATEGORY_KIND: dict[str, tuple[str, bool]] = {
    "kernel": ("compute", True),  # refined to "comm" by is_comm_kernel()
    "gpu_memcpy": ("memcpy", True),
    "gpu_memset": ("memcpy", True),
    "cuda_sync": ("cpu", True),
    "gpu_user_annotation": ("phase", True),
    "user_annotation": ("phase", False),  # refined by ANNOTATION_KIND
    "cpu_op": ("cpu", False),
    "cuda_runtime": ("cpu", False),
    "cuda_driver": ("cpu", False),
    "python_function": ("cpu", False),
}
DEFAULT_KIND = ("cpu", False)

# Host annotation names -> kind, first match wins. Sources: torch.profiler's own record
# functions (ProfilerStep#N, enumerate(DataLoader)#..., Optimizer.step#...), c10d's gloo
# backend (gloo:all_reduce etc. on pt_gloo_runloop threads), HTA's test traces ("## x ##").
ANNOTATION_KIND: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"ProfilerStep\s*#\s*\d+$"), "step"),
    (re.compile(r"gloo:"), "comm"),
    (re.compile(r"enumerate\(DataLoader\)|stepscope\.data\b|## (data_load|load_batch|"
                r"wait_for_batch) ##"), "data"),
    (re.compile(r"nccl:|c10d::"), "cpu"),  # host-side launch records; the kernels are comm
)

# Communication kernels. HTA matches only ``^nccl.*Kernel``; real names also include
# ``void ncclKernel_...`` (demangled with return type), ``ncclDevKernel_Generic``,
# RCCL's ``rccl...``/``ncclDevKernel`` on ROCm, MSCCL's ``mscclKernel_...``, and kernels that
# carry an ``args["Collective name"]`` (Kineto >= 2.1 NCCL metadata).
COMM_KERNEL_RE = re.compile(r"(?:^|[\s:_])(?:nccl|rccl|msccl)\w*", re.IGNORECASE)
COMM_LOOKED_FOR = ("device kernels named nccl*/rccl*/msccl* (any case, with or without a "
                   "'void ' prefix), kernels with a 'Collective name' arg, and gloo:* "
                   "annotations on pt_gloo_runloop threads")



def is_comm_kernel(name: str) -> bool:
    """True for a collective-communication kernel name (NCCL, RCCL, MSCCL spellings)."""
    return COMM_KERNEL_RE.search(name) is not None


def looks_like(path: Path) -> bool:
    """True when ``path`` is a ``.json``/``.json.gz`` file that starts like a Chrome trace."""
    name = path.name.lower()
    if not path.is_file() or not (name.endswith(".json") or name.endswith(".json.gz")):
        return False
    try:
        with _open(path) as fh:
            head = fh.read(1 << 16)
    except (OSError, EOFError, gzip.BadGzipFile):
        return False
    return b'"traceEvents"' in head or (head.lstrip()[:1] == b"[" and b'"ph"' in head)


def truncated_gzip(path: Path) -> bool:
    """True when ``path`` is gzip data whose stream ends before its end marker."""
    try:
        with open(path, "rb") as fh:
            if fh.read(2) != b"\x1f\x8b":
                return False
        with gzip.open(path, "rb") as gz:
            while gz.read(1 << 20):
                pass
    except EOFError:
        return True
    except (OSError, gzip.BadGzipFile):
        return False
    return False


def read(path: Path) -> EventTable:
    """Read one Kineto trace file (``.json`` or ``.json.gz``) into an EventTable.

    Example::

        t = read(Path("../shared/data/traces/kineto-gpu/ns_resolution/rank-0...json.gz"))
        len(t), t.meta["ts_is_float"]          # (45420, True)
    """
    path = Path(path)
    try:
        acc = _new_accumulator(path)
        try:
            for events in _event_chunks(path, acc):
                acc.add(events)
        except _Reframe:
            acc = _new_accumulator(path)
            with _open(path) as fh:
                data = fh.read()
            for events in _whole(data, path, acc):
                acc.add(events)
        return acc.finish()
    except TraceFormatError:
        raise
    except EOFError as exc:
        raise TraceFormatError(
            f"{path}: truncated gzip file ({exc}): the copy or the profiler's write was cut "
            "off; copy it again or capture a new trace") from exc
    except (OSError, gzip.BadGzipFile, UnicodeDecodeError) as exc:
        raise TraceFormatError(
            f"{path}: could not read the file ({exc}); expected a PyTorch profiler trace "
            "(.json or .json.gz). Check that the file is complete and readable.") from exc
    except (ValueError, TypeError, KeyError, OverflowError, IndexError,
            AttributeError, RecursionError) as exc:
        raise TraceFormatError(
            f"{path}: not a valid PyTorch profiler (Kineto) trace ({type(exc).__name__}: "
            f"{exc}); expected a JSON object with a 'traceEvents' array of Chrome-trace "
            "events. Re-export it with torch.profiler's export_chrome_trace or "
            "tensorboard_trace_handler.") from exc


def _new_accumulator(path: Path) -> _Accumulator:
    return _Accumulator(path, EVENT_FIELDS, ARG_FIELDS, _classify, _Args())


def _classify(cat: str, name: str, collective: bool) -> tuple[str, bool]:
    """(kind, on_device) of one (category, name) pair, from the tables above."""
    kind, on_device = CATEGORY_KIND.get(cat, DEFAULT_KIND)
    if cat == "kernel" and (collective or is_comm_kernel(name)):
        return "comm", True
    if cat == "user_annotation" or (cat == "cpu_op" and name.startswith("gloo:")):
        for pattern, ann_kind in ANNOTATION_KIND:
            if pattern.match(name):
                return ann_kind, False
    return kind, on_device


# The decoder types, generated from the tables: msgspec fills only these fields and skips
# everything else (call stacks, shapes, ...) in C without building Python objects for it.
_Args = msgspec.defstruct(
    "KinetoArgs", [(f.column, Any, f.default) for f in ARG_FIELDS],
    rename={f.column: f.raw for f in ARG_FIELDS})
_Event = msgspec.defstruct(
    "KinetoEvent", [("ph", Any, None), *((f.column, Any, f.default) for f in EVENT_FIELDS),
                    ("args", Optional[_Args], None)],  # noqa: UP045 (runtime type object)
    rename={f.column: f.raw for f in EVENT_FIELDS})
_Doc = msgspec.defstruct(
    "KinetoDoc", [("traceEvents", Optional[list[_Event]], None),  # type: ignore[valid-type]  # noqa: UP045,E501
                  ("distributedInfo", Any, None), ("deviceProperties", Any, None)])
_LIST_DECODER = msgspec.json.Decoder(list[_Event])  # type: ignore[valid-type]
_DOC_DECODER = msgspec.json.Decoder(_Doc)


def _decode_list(data: bytes) -> list[Any]:
    """Events of a JSON array: typed structs, or plain dicts when a field has an odd type."""
    try:
        events: list[Any] = _LIST_DECODER.decode(data)
        return events
    except msgspec.ValidationError:
        pass
    except msgspec.DecodeError:
        raise _Reframe() from None
    try:
        loaded = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise _Reframe() from None
    return loaded if isinstance(loaded, list) else [loaded]


def _decode_doc(data: bytes) -> tuple[Any, dict[str, Any]]:
    """(events or None, header keys) of a whole trace object; orjson when types are odd."""
    try:
        doc = _DOC_DECODER.decode(data)
        return getattr(doc, "traceEvents"), {  # noqa: B009 (fields made by defstruct)
            "distributedInfo": getattr(doc, "distributedInfo"),  # noqa: B009
            "deviceProperties": getattr(doc, "deviceProperties")}  # noqa: B009
    except msgspec.ValidationError:
        pass
    loaded = orjson.loads(data)
    if not isinstance(loaded, dict):
        return loaded, {}
    return loaded.pop("traceEvents", None), loaded


class _Reframe(Exception):
    """The streaming framing guessed wrong; decode the whole document instead."""


def _open(path: Path) -> IO[bytes]:
    with open(path, "rb") as probe:
        magic = probe.read(2)
    return cast(IO[bytes], gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb"))


# ---------------------------------------------------------------- streaming the array

_BOUNDARY_RE = re.compile(rb"\}\s*,\s*\{")


def _event_chunks(path: Path, acc: _Accumulator) -> Iterator[list[Any]]:
    """Yield lists of raw events; on any framing surprise, fall back to one full decode."""
    with _open(path) as fh:
        buf = fh.read(CHUNK_BYTES)
        start = _array_start(buf)
        if start is None:
            yield from _whole(buf + fh.read(), path, acc)
            return
        head, buf = buf[:start], buf[start:]
        try:
            acc.header(orjson.loads(head + b"]}") if head.lstrip()[:1] == b"{" else {})
        except orjson.JSONDecodeError:
            raise _Reframe() from None
        while True:
            more = fh.read(CHUNK_BYTES)
            if not more:
                break
            buf += more
            cut = _last_boundary(buf)
            if cut is None:
                continue
            yield _decode_list(b"[" + buf[:cut + 1] + b"]")
            buf = buf[cut + 1:].lstrip()[1:]  # drop the ',' between events
        tail = _tail(buf, head)
        if tail is None:
            raise _Reframe()
        acc.header(tail[1])
        yield tail[0]


def _array_start(buf: bytes) -> int | None:
    """Offset just after the '[' of the traceEvents array (or of a bare array)."""
    stripped = buf.lstrip()
    if stripped[:1] == b"[":
        return len(buf) - len(stripped) + 1
    key = buf.find(b'"traceEvents"')
    if key < 0:
        return None
    colon = buf.find(b":", key + 13)
    if colon < 0 or buf[key + 13:colon].strip():
        return None
    rest = buf[colon + 1:]
    body = rest.lstrip()
    if body[:1] != b"[":
        return None
    return colon + 1 + (len(rest) - len(body)) + 1


def _last_boundary(buf: bytes) -> int | None:
    """Index of the '}' that closes the last complete-looking event in ``buf``."""
    window = 1 << 16
    while True:
        lo = max(0, len(buf) - window)
        matches = list(_BOUNDARY_RE.finditer(buf, lo))
        if matches:
            return matches[-1].start()
        if lo == 0:
            return None
        window *= 4


def _tail(buf: bytes, head: bytes) -> tuple[list[Any], dict[str, Any]] | None:
    """Decode the last events plus any keys after the array (``]`` ``, "traceName": ..}``)."""
    try:
        if head.lstrip()[:1] == b"[":
            return _decode_list(b"[" + buf), {}
        events, rest = _decode_doc(b'{"traceEvents":[' + buf)
    except (_Reframe, msgspec.DecodeError, orjson.JSONDecodeError):
        return None
    return (events if isinstance(events, list) else []), rest


def _whole(data: bytes, path: Path, acc: _Accumulator) -> Iterator[list[Any]]:
    try:
        bare = data.lstrip()[:1] == b"["
        events, rest = (_decode_list(data), {}) if bare else _decode_doc(data)
    except (_Reframe, msgspec.DecodeError, orjson.JSONDecodeError) as exc:
        raise TraceFormatError(
            f"{path}: not valid JSON ({exc or 'malformed'}); expected a PyTorch profiler "
            "trace. The file may be truncated or still being written.") from None
    if not isinstance(events, list):
        raise TraceFormatError(
            f"{path}: no 'traceEvents' array of events; expected a PyTorch profiler (Kineto) "
            "trace (a JSON object with 'traceEvents').")
    acc.header(rest)
    yield events

