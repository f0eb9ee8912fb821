"""The environment rules, live: the host is contended, the clock is throttled.

The judgement is the offline regimes' (``analysis/regimes.py``: :func:`environment_cause`, with its
thresholds ``RUNQ_DELTA``, ``CPU_SHARE_DROP``, ``PREEMPT_RATIO``, ``CLOCK_RATIO``, ...):
a stretch of steps against a reference stretch. Live, the stretch is the latest
``RECENT_STEPS`` steps and ``RECENT_SAMPLES`` condition samples, the reference the rolling
window of normal steps and their samples (a flagged or slow stretch never enters it, so
contention cannot become the new normal while it is reported). The rule fires only when
the steps are also slower by the regimes' ``MIN_SHIFT`` (a busy neighbour that costs
nothing is not worth a message), ``consecutive`` steps in a row, once per episode.

Inputs are the step records' ``cpu_s`` and ``preempt`` (the recorder's getrusage per step)
and the condition samples (``conditions.py``: ``main_oncpu_frac``, ``main_runq_frac``,
``cpu_mhz``, the GPU clocks, ...) the recorder's writer thread writes. Pure: no clock, no I/O.

Example::

    env = EnvironmentRule("exp1", rank=0, consecutive=3, window_steps=100)
    env.observe_sample(sample)                      # each condition sample, in order
    alerts = env.observe_step(record, step, now_s)  # each step record after warm-up
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from typing import Any

from ..analysis.regimes import MIN_SHIFT, environment_cause
from .model import Alert
from .rolling import RollingMedian, record_value

__all__ = ["EnvironmentRule", "RECENT_STEPS", "RECENT_SAMPLES", "REFERENCE_MIN_STEPS"]

# The stretch judged: the latest 5 steps (the rule then needs `consecutive` judgements in
# a row, so a single slow step never fires) and the latest 2 condition samples (about a
# second at the writer's cadence).
RECENT_STEPS = 5
RECENT_SAMPLES = 2
# A reference needs 12 normal steps (HealthConfig.min_steps) before anything is judged.
REFERENCE_MIN_STEPS = 12
# Condition fields the regimes' attribution reads.
_FIELDS = ("main_oncpu_frac", "main_runq_frac", "others_cpu_cores", "host_steal_frac",
           "cpu_mhz", "gpu_sm_clock_mhz", "gpu_throttle_reasons")
_SRC = "environment rules (analysis/regimes.py), live"
_NEXT = {
    "contention": "another process is taking this run's CPUs: find it (top, pidstat) or move "
                  "the run; the step times of this stretch measure the host, not the code",
    "throttling": "the clock is held down (power, temperature, a clock cap): check cooling "
                  "and power limits (nvidia-smi -q -d PERFORMANCE); this stretch measures "
                  "the hardware's state, not the code",
}
_HEAD = {"contention": "the host is contended", "throttling": "the clock is throttled"}


def _median(values: deque[float]) -> float:
    good = sorted(v for v in values if math.isfinite(v))
    if not good:
        return math.nan
    n = len(good)
    return good[n // 2] if n % 2 else 0.5 * (good[n // 2 - 1] + good[n // 2])


class EnvironmentRule:
    """Contention and throttling for one rank (see the module docstring)."""

    def __init__(self, run: str, rank: int, consecutive: int, window_steps: int,
                 reference_samples: int = 60) -> None:
        self.run, self.rank, self.consecutive = run, rank, consecutive
        self._ref = {k: RollingMedian(window_steps) for k in
                     ("step_time_s", "cpu_per_wall", "preempt_per_s")}
        self._ref_steps: deque[int] = deque(maxlen=window_steps)
        self._ref_cond = {k: RollingMedian(reference_samples) for k in _FIELDS}
        self._recent: dict[str, deque[float]] = {
            k: deque(maxlen=RECENT_STEPS) for k in ("step_time_s", "cpu_per_wall",
                                                    "preempt_per_s")}
        self._samples: deque[Mapping[str, Any]] = deque(maxlen=RECENT_SAMPLES)
        self._flagged: str | None = None
        self._streak = 0
        self._fired = False
        self._last_end: tuple[int, float] | None = None  # (step, end_s) of the last record

    def observe_sample(self, sample: Mapping[str, Any]) -> None:
        """A condition sample. It joins the reference when it leaves the recent window
        with nothing flagged: by then the steps it covered have been judged (a sample is
        often read before the step records of its interval)."""
        if len(self._samples) == RECENT_SAMPLES and self._flagged is None:
            for k in _FIELDS:
                v = record_value(self._samples[0], k)
                if v is not None and math.isfinite(v):
                    self._ref_cond[k].push(v)
        self._samples.append(sample)

    def _usage_wall(self, record: Mapping[str, Any], step: int | None, st: float) -> float:
        """The wall seconds ``cpu_s`` and ``preempt`` cover: from the previous step's end
        to this one's (as ``analysis.regimes.usage_wall``), else the step's own time."""
        end = record_value(record, "end_s")
        last, self._last_end = self._last_end, (
            (step, end) if step is not None and end is not None and math.isfinite(end)
            else None)
        if last is None or self._last_end is None or step != last[0] + 1:
            return st
        gap = self._last_end[1] - last[1]
        return gap if gap > 0 else st

    def observe_step(self, record: Mapping[str, Any], step: int | None,
                     now_s: float) -> list[Alert]:
        st = record_value(record, "step_time_s")
        if st is None or not math.isfinite(st) or st <= 0:
            return []
        cpu, pre = record_value(record, "cpu_s"), record_value(record, "preempt")
        wall = self._usage_wall(record, step, st)
        row = {"step_time_s": st,
               "cpu_per_wall": cpu / wall if cpu is not None else math.nan,
               "preempt_per_s": pre / wall if pre is not None else math.nan}
        for k, v in row.items():
            self._recent[k].append(v)
        ready = len(self._ref["step_time_s"]) >= REFERENCE_MIN_STEPS
        cause = self._judge() if ready and len(self._recent["step_time_s"]) == RECENT_STEPS \
            else None
        self._flagged = cause[0] if cause else None
        ref_st = self._ref["step_time_s"].median() if ready else math.inf
        if cause is None and st <= (1 + MIN_SHIFT) * ref_st:
            for k, v in row.items():
                if math.isfinite(v):
                    self._ref[k].push(v)
            if step is not None:
                self._ref_steps.append(step)
        if cause is None:
            self._streak, self._fired = 0, False
            return []
        self._streak += 1
        if self._streak < self.consecutive or self._fired:
            return []
        self._fired = True
        return [self._alert(cause, step, now_s)]

    def _stretch(self) -> tuple[dict[str, float], dict[str, float]]:
        cur = {k: _median(v) for k, v in self._recent.items()}
        ref = {k: m.median() if len(m) else math.nan for k, m in self._ref.items()}
        for k in _FIELDS:
            vals: deque[float] = deque(v for s in self._samples
                                       if (v := record_value(s, k)) is not None)
            cur[k] = _median(vals)
            ref[k] = self._ref_cond[k].median() if len(self._ref_cond[k]) else math.nan
        return cur, ref

    def _judge(self) -> tuple[str, str, dict[str, float], dict[str, float]] | None:
        cur, ref = self._stretch()
        if not cur["step_time_s"] >= (1 + MIN_SHIFT) * ref["step_time_s"]:
            return None
        steps = (self._ref_steps[0], self._ref_steps[-1]) if self._ref_steps else (0, 0)
        found = environment_cause(cur, ref, steps)
        return (found[0], found[1], cur, ref) if found else None

    def _alert(self, cause: tuple[str, str, dict[str, float], dict[str, float]],
               step: int | None, now_s: float) -> Alert:
        kind, why, cur, ref = cause
        ratio = cur["step_time_s"] / ref["step_time_s"]
        first, last = (self._ref_steps[0], self._ref_steps[-1]) if self._ref_steps else (0, 0)
        values = {"step_time_s": cur["step_time_s"], "ref_step_time_s": ref["step_time_s"]}
        for k in ("cpu_per_wall", "preempt_per_s", *_FIELDS):
            if math.isfinite(cur[k]) and math.isfinite(ref[k]):
                values[k], values[f"ref_{k}"] = cur[k], ref[k]
        return Alert(
            rule=kind, severity="warning", run=self.run, rank=self.rank, step=step,
            message=f"{_HEAD[kind]}: steps take {ratio:.1f}x as long as in steps {first}-"
                    f"{last} ({cur['step_time_s']:.3g} s against {ref['step_time_s']:.3g} s); "
                    f"{why}",
            next_step=_NEXT[kind], source=_SRC, values=values, time_s=now_s)
