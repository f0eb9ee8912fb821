"""MindSpore profiler capture of chosen steps into ``profiles/<UTC timestamp>/``.

The field report archives every profile with a timestamp so two runs can be diffed without
re-running. ``ProfileCapture`` starts ``mindspore.profiler.profile`` before the first chosen
step and stops it (MindSpore then writes its ``*_ascend_ms`` directory) after the last,
writes the step windows it timed beside the profile (``stepscope_steps.json``, epoch
microseconds: the trace reader assigns ops to steps by them) and records a ``profile``
event naming the capture. In PyNative mode the network and optimizer given to ``attach``
are hooked while the capture runs (``marks.PhaseMarks``): their phase windows go into the
same file, and the reader splits forward/backward/optimizer by them.

The profiler runs on a schedule of exactly the captured steps (``schedule(wait=0,
warmup=1, active=N, repeat=1)``; the warm-up is the initialisation just before the first
captured step, so no training step is spent on it) and is stepped after each one: the last
``step()`` saves the trace (RECORD_AND_SAVE -> NONE), so ``stop()`` finds nothing left to do
and neither MindSpore's "Incorrect schedule: Stop profiler while current state is RECORD"
warning (the default schedule never leaves RECORD) nor its "won't be using warmup" fires.
Nothing is parsed or analysed in the training process: ``stepscope trace RUN`` and
``stepscope diagnose RUN`` read the archived profile.

Ranks of one job share one profile directory: its timestamp is rank 0's time, agreed with
one ``AllGather`` (the earliest start wins) when the job has more than one rank.

Example::

    cap = ProfileCapture(run, steps=(5, 7), rank=0, world=1)
    for step in ...:
        cap.before_step(step); ...; cap.after_step(step)
    cap.close()
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ...rundir.store import RunDir, utc_stamp
from ...traces.mindspore_phases import MARKERS_FILE
from .marks import PhaseMarks

__all__ = ["ProfileCapture"]


class ProfileCapture:
    """Profile steps ``steps[0]..steps[1]`` (inclusive, 0-based) of this rank."""

    def __init__(self, run: RunDir, steps: tuple[int, int], rank: int, world: int) -> None:
        first, last = int(steps[0]), int(steps[1])
        if first < 0 or last < first:
            raise ValueError(f"profile_steps must be (first, last) with 0 <= first <= last, "
                             f"got {steps!r}")
        self.run, self.first, self.last = run, first, last
        self.rank, self.world = rank, world
        self.dir: Path | None = None
        self._prof: Any = None
        self._windows: list[dict[str, Any]] = []
        self._t_begin = 0.0
        self._stop_s = math.nan
        self.done = False
        self._cells: tuple[Any, Any] = (None, None)
        self._marks = PhaseMarks()
        self._phase_windows: list[dict[str, Any]] = []

    def attach(self, network: Any = None, optimizer: Any = None) -> None:
        """The cells whose hooks mark phases during the capture (PyNative; see marks.py)."""
        self._cells = (network, optimizer)

    def _stamp(self) -> str:
        now = time.time()
        if self.world > 1:
            import mindspore as ms

            # int32 parts (CPU AllGather casts float64 to float32: 128 s resolution at
            # epoch magnitude): [seconds // 1e5, seconds % 1e5, milliseconds]
            sec = int(now)
            parts = np.asarray([[sec // 100_000, sec % 100_000, int(now % 1 * 1000)]],
                               dtype=np.int32)
            rows = ms.ops.AllGather()(ms.Tensor(parts)).asnumpy().tolist()
            hi, lo, milli = min(tuple(int(v) for v in r) for r in rows)
            now = hi * 100_000 + lo + milli / 1000.0
        return utc_stamp(_dt.datetime.fromtimestamp(now, _dt.timezone.utc))

    def active(self, step: int) -> bool:
        """True for a profiled step (its times include the profiler's own overhead)."""
        return self.first <= step <= self.last

    def before_step(self, step: int) -> None:
        if step == self.first and self._prof is None and not self.done:
            import mindspore as ms
            from mindspore.profiler import (
                ProfilerActivity,
                profile,
                schedule,
                tensorboard_trace_handler,
            )

            self.dir = self.run.new_profile_dir(self._stamp())
            target = str(ms.get_context("device_target"))
            activities = [ProfilerActivity.CPU] + (
                [ProfilerActivity.NPU] if target == "Ascend" else
                [ProfilerActivity.GPU] if target == "GPU" else [])
            active = self.last - self.first + 1
            self._prof = profile(activities=activities, start_profile=False,
                                 schedule=schedule(wait=0, warmup=1, active=active, repeat=1),
                                 on_trace_ready=tensorboard_trace_handler(str(self.dir)))
            self._prof.start()  # NONE -> WARM_UP: the profiler initialises
            self._prof.step()  # WARM_UP -> RECORD: records from this step on
            if any(c is not None for c in self._cells):
                self._marks.attach(*self._cells)
        self._marks.events.clear()  # marks of this step only
        self._t_begin = time.time()

    def after_step(self, step: int) -> None:
        if self._prof is None:
            return
        self._windows.append({"rank": self.rank, "step": step,
                              "start_us": self._t_begin * 1e6, "end_us": time.time() * 1e6})
        self._phase_windows += self._marks.take(step, self.rank)
        if step >= self.last:
            self.close()
        else:
            self._prof.step()  # RECORD -> RECORD: nothing to do

    def close(self) -> None:
        """Stop the profiler (if running), write the step windows, record the event."""
        if self._prof is None or self.done:
            return
        prof, self._prof = self._prof, None
        self.done = True
        self._marks.detach()
        t0 = time.perf_counter()
        # The last scheduled step saves (MindSpore parses its raw data here: ~1 s on CPU,
        # between two steps); stop() then only closes. Closed early (the run ended inside
        # the window), stop() saves what was recorded, with MindSpore's warning.
        if len(self._windows) == self.last - self.first + 1:
            prof.step()
        prof.stop()
        self._stop_s = time.perf_counter() - t0
        out = self._rank_output()
        if out is None:
            self.run.append_event({"type": "warning", "rank": self.rank, "message":
                                   f"MindSpore profiler wrote nothing under {self.dir}"})
            return
        doc: dict[str, Any] = {"steps": self._windows}
        if self._phase_windows:
            doc["phases"] = self._phase_windows
            doc["phase_marks"] = "network and optimizer hooks, each after a device sync"
        elif self._marks.note:
            doc["phase_marks_note"] = self._marks.note
        # MindSpore names its per-rank files by the rank it ran as (``*_{rank}.txt``): that
        # is this capture's rank, also where the session was set up before the
        # communication was (an msrun worker that read no rank yet would say 0).
        rank = _profiler_rank(out)
        if rank is not None and rank != self.rank:
            for w in self._windows + self._phase_windows:
                w["rank"] = rank
            self.rank = rank
        self.run.write_profile_file(out, MARKERS_FILE, orjson.dumps(doc))
        # Only where the capture is: reading and analysing it is the readers' work
        # (`stepscope trace`, `stepscope diagnose`), never the training process's.
        self.run.append_event({"type": "profile", "rank": self.rank,
                               "path": str(out.relative_to(self.run.path)),
                               "steps": [self.first, self.last], "stop_s": self._stop_s})

    def _rank_output(self) -> Path | None:
        assert self.dir is not None
        mine = [d for d in self.dir.glob("*_ascend_ms") if f"_{os.getpid()}_" in d.name]
        return max(mine, key=lambda d: d.stat().st_mtime) if mine else None


def _profiler_rank(out: Path) -> int | None:
    """The rank in the names of MindSpore's per-rank files (``*_{rank}.txt``/``.json``)."""
    for f in sorted(out.glob("FRAMEWORK/cpu_op_execute_timestamp_*.txt")) + \
            sorted(out.glob("profiler_info_*.json")):
        stem = f.stem.rsplit("_", 1)[-1]
        if stem.isdigit():
            return int(stem)
    return None
