"""Helpers for the trace tests: tiny hand-made Kineto traces with hand-computable numbers."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson


def ev(name: str, ts: float, dur: float, *, cat: str = "cpu_op", tid: int = 1, pid: int = 1,
       **args: Any) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts,
            "dur": dur, "args": args}


def thread_name(tid: int, name: str, pid: int = 1) -> dict[str, Any]:
    return {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}}


def write_trace(path: Path, events: list[dict[str, Any]], rank: int = 0,
                indent: bool = True) -> Path:
    doc = {"schemaVersion": 1, "distributedInfo": {"backend": "gloo", "rank": rank},
           "traceEvents": events, "traceName": str(path.name)}
    data = orjson.dumps(doc, option=orjson.OPT_INDENT_2 if indent else 0)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def cpu_step_events(offset: float = 0.0, step: int = 1) -> list[dict[str, Any]]:
    """One 100 µs step of a 2-thread CPU DDP-like trace (numbers in test_trace_analysis)."""
    o = offset
    return [
        ev(f"ProfilerStep#{step}", o + 0, 100, cat="user_annotation"),
        ev("stepscope.data", o + 0, 10, cat="user_annotation"),
        ev("stepscope.forward", o + 10, 30, cat="user_annotation"),
        ev("stepscope.backward", o + 40, 40, cat="user_annotation"),
        ev("stepscope.optimizer", o + 85, 10, cat="user_annotation"),
        ev("aten::mm", o + 10, 30),
        ev("aten::mm_backward", o + 40, 40),
        ev("aten::add_", o + 85, 10),
        ev("gloo:all_reduce", o + 60, 30, cat="user_annotation", tid=2),
    ]
