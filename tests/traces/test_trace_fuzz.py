"""Fuzzed and truncated traces: reading and analysing them either works or raises
TraceFormatError (the one clear error), never anything else."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import orjson
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from stepscope.analysis.trace.breakdown import analyze
from stepscope.errors import TraceFormatError
from stepscope.traces import kineto
from support.traces import cpu_step_events, ev, thread_name

_BASE = orjson.dumps({"schemaVersion": 1, "distributedInfo": {"rank": 0},
                      "traceEvents": [thread_name(2, "pt_gloo_runloop")]
                      + cpu_step_events() + cpu_step_events(100.0, 2)
                      + [ev("kernel_x", 5, 3, cat="kernel", tid=7, stream=7, correlation=1),
                         ev("cudaLaunchKernel", 4, 1, cat="cuda_runtime", correlation=1)]},
                     option=orjson.OPT_INDENT_2)
_SETTINGS = settings(max_examples=150, deadline=None,
                     suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70)
    | st.floats(allow_nan=True, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                               max_size=4),
    max_leaves=12)


def _read_or_clear_error(path: Path) -> None:
    try:
        tables = [kineto.read(path)]
    except TraceFormatError as exc:
        assert str(path) in str(exc)
        return
    analyze(tables, hta_compatible=False)
    analyze(tables, hta_compatible=True)


@_SETTINGS
@given(cut=st.integers(0, len(_BASE)), gz=st.booleans())
def test_truncated(tmp_path: Path, cut: int, gz: bool) -> None:
    data = _BASE[:cut]
    p = tmp_path / ("t.json.gz" if gz else "t.json")
    p.write_bytes(gzip.compress(data) if gz else data)
    _read_or_clear_error(p)


@_SETTINGS
@given(doc=json_values)
def test_arbitrary_json(tmp_path: Path, doc: Any) -> None:
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))  # stdlib: writes >64-bit ints and NaN, as bad writers do
    _read_or_clear_error(p)


@_SETTINGS
@given(key=st.sampled_from(["ph", "ts", "dur", "name", "cat", "tid", "args", "pid"]),
       value=json_values, index=st.integers(0, 20))
@example(key="dur", value=False, index=19)  # the only kernel lasts 0 µs: empty busy set
def test_mutated_event_field(tmp_path: Path, key: str, value: Any, index: int) -> None:
    doc = orjson.loads(_BASE)
    events = doc["traceEvents"]
    events[index % len(events)][key] = value
    p = tmp_path / "t.json"
    p.write_text(json.dumps(doc))
    _read_or_clear_error(p)


@_SETTINGS
@given(junk=st.binary(max_size=200))
def test_random_bytes(tmp_path: Path, junk: bytes) -> None:
    p = tmp_path / "t.json"
    p.write_bytes(b'{"traceEvents": [' + junk)
    _read_or_clear_error(p)
