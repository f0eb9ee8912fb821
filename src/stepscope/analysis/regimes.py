"""Regimes of a run: stretches of steps that ran at one speed, and why each ran as it did.

A run on a shared host is often two runs in one: steps 0-70 at 3 s while a neighbour
compiles, steps 70-150 at 0.45 s once it is done. A mean over both describes neither, and
advice drawn from the slow part ("compute-bound: fuse kernels") is wrong. So the step-time
series (warm-up excluded) is segmented, and each regime is attributed against the
reference regime (the fastest regime holding at least ``MIN_REFERENCE_FRAC`` of the steps)
with its evidence:

* ``contention``: the training thread got less CPU and queued ``RUNQ_DELTA`` more of the
  wall time for one (schedstat, from the condition samples), or involuntary context
  switches per second at least ``PREEMPT_RATIO`` x the reference and CPU per wall-second
  down, or other processes busier by
  ``OTHERS_CORES_DELTA`` cores, or hypervisor steal up by ``STEAL_DELTA``: the CPU was
  taken away.
* ``throttling``: CPU clock or GPU SM clock below ``CLOCK_RATIO`` x the reference, or NVML
  slow-down reasons set where the reference had none.
* ``waiting``: CPU per wall-second down by ``CPU_SHARE_DROP`` with no more preemptions:
  the process slept (I/O, a queue, a lock).
* ``more work``: the CPU share held, the steps got longer: the process computed more.
* ``faster`` (a short regime quicker than the reference) and ``unexplained`` (no CPU
  accounting recorded).

Contention and throttling are *environment*: the headline numbers skip them. The
steady-state regime (``Regimes.steady``) is the longest regime the environment does not
explain (the later one on a tie); the sheet's tokens/s, step time and MFU, compare, the
index and the HTML report all use its steps (``Regimes.mask``).

Segmentation (:func:`segment`): binary segmentation (Scott & Knott 1974) of log step time
under a squared error cost, at most ``MAX_REGIMES`` regimes of at least
``MIN_REGIME_STEPS`` steps; a split is kept only when the two sides' mean log step times
differ by ``MIN_SHIFT`` and by ``SPLIT_Z`` x their standard errors. Every threshold is
stepscope's choice, stated where it is set.

Example::

    regs = find_regimes(table, steady_mask(table), conditions=run.read_conditions())
    [(r.first_step, r.last_step, r.cause) for r in regs.regimes]   # [(1, 69, "contention"), ...]
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .._fastnp import is_ordered, unique_ints
from ..schema import AnyArray, StepTable
from ._groups import median_by
from .step_grid import StepGrid, step_grid

__all__ = ["Regime", "Regimes", "find_regimes", "segment", "ENVIRONMENT_CAUSES",
           "condition_columns", "window_values", "host_took_cpu", "environment_cause",
           "usage_wall",
           "MIN_SHIFT", "SPLIT_Z", "MIN_REGIME_STEPS", "MAX_REGIMES"]

# The reference regime holds at least a tenth of the steady steps: a busy neighbour can
# cover most of a run, and the quiet stretch is the one to measure against.
MIN_REFERENCE_FRAC = 0.10
# Attribution thresholds (stepscope's choices; the field report's contended run had 6x the
# preemptions and 0.6x the CPU per wall-second of the quiet one).
PREEMPT_RATIO = 2.0
PREEMPT_MIN_DELTA_PER_S = 5.0  # below 5 extra switches/s a process is not being starved
CPU_SHARE_DROP = 0.2
OTHERS_CORES_DELTA = 0.5
STEAL_DELTA = 0.05
# The main thread queued for a CPU at least 5% more of the wall time (schedstat).
RUNQ_DELTA = 0.05
CLOCK_RATIO = 0.9
ENVIRONMENT_CAUSES: tuple[str, ...] = ("contention", "throttling")
# Condition fields summarised per regime (medians of the samples inside it).
_COND_FIELDS = ("main_oncpu_frac", "main_runq_frac", "others_cpu_cores", "host_steal_frac",
                "load_1m", "procs_running", "cpu_mhz", "gpu_sm_clock_mhz",
                "gpu_throttle_reasons", "gpu_other_procs", "gpu_temp_c", "gpu_power_w")


_LAST_COLUMNS: list[tuple[Any, dict[str, AnyArray]] | None] = [None]


@dataclass
class Regime:
    """One stretch of steps at one speed. Rates are medians per step; None = not recorded."""

    index: int
    first_step: int
    last_step: int
    steps: int
    step_time_s: float
    tokens_per_s: float | None
    cpu_per_wall: float | None
    preempt_per_s: float | None
    conditions: dict[str, float] = field(default_factory=dict)
    cause: str = "reference"
    evidence: str = ""
    steady: bool = False

    @property
    def name(self) -> str:
        return f"steps {self.first_step}-{self.last_step}"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "name": self.name}


@dataclass
class Regimes:
    """The regimes of one run, in step order; ``steady`` indexes the headline regime."""

    regimes: list[Regime]
    steady: int | None

    @property
    def steady_regime(self) -> Regime | None:
        return self.regimes[self.steady] if self.steady is not None else None

    def mask(self, table: StepTable) -> AnyArray:
        """Rows of ``table`` inside the steady regime (all rows when there is none)."""
        r = self.steady_regime
        if r is None or len(self.regimes) < 2:
            return np.ones(len(table), dtype=bool)
        return np.asarray((table["step"] >= r.first_step) & (table["step"] <= r.last_step))

    def environment(self) -> list[Regime]:
        return [r for r in self.regimes if r.cause in ENVIRONMENT_CAUSES]

    def to_dict(self) -> dict[str, Any]:
        return {"regimes": [r.to_dict() for r in self.regimes], "steady": self.steady}


# -- segmentation -------------------------------------------------------------------------
# A regime's typical step time differs from its neighbour's by at least 20%: step times of
# one configuration on a shared 2-core host jitter by ~10% (measured on the demo), so 20%
# is a change of condition, not noise.
MIN_SHIFT = 0.20
# Split significance: the difference of mean log step times exceeds 5 standard errors.
SPLIT_Z = 5.0
MIN_REGIME_STEPS = 5
MAX_REGIMES = 4


def _mean_se(x: AnyArray) -> float:
    return math.sqrt(float(np.var(x, ddof=1)) / x.size) if x.size > 1 else math.inf


def _best_cut(y: AnyArray, lo: int, hi: int, min_len: int) -> int | None:
    """Cut of y[lo:hi] minimising the two sides' squared error (prefix sums, O(n))."""
    seg = y[lo:hi]
    n = seg.size
    if n < 2 * min_len:
        return None
    c1, c2 = np.cumsum(seg), np.cumsum(seg * seg)
    k = np.arange(min_len, n - min_len + 1)
    left = c2[k - 1] - c1[k - 1] ** 2 / k
    right = (c2[-1] - c2[k - 1]) - (c1[-1] - c1[k - 1]) ** 2 / (n - k)
    return lo + int(k[int(np.argmin(left + right))])


def _significant(y: AnyArray, lo: int, cut: int, hi: int) -> bool:
    """Means of log step time (Welch's t): a median would split an alternating 0.08/0.12 s
    series anywhere, and a single stall inflates its own side's error, so it never splits."""
    a, b = y[lo:cut], y[cut:hi]
    shift = abs(float(np.mean(a) - np.mean(b)))
    return bool(shift >= math.log1p(MIN_SHIFT)
                and shift >= SPLIT_Z * math.hypot(_mean_se(a), _mean_se(b)))


def segment(step_time_s: AnyArray, min_len: int = MIN_REGIME_STEPS,
            max_regimes: int = MAX_REGIMES) -> list[tuple[int, int]]:
    """Index ranges ``[start, end)`` of regimes of a positive step-time series.

    Example: ``segment(np.r_[np.full(30, 3.0), np.full(30, 0.45)])`` -> ``[(0, 30), (30, 60)]``.
    """
    y = np.log(np.maximum(np.asarray(step_time_s, dtype=float), 1e-12))
    bounds = [0, y.size]
    while len(bounds) - 1 < max_regimes:
        best: tuple[float, int] | None = None
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            cut = _best_cut(y, lo, hi, min_len)
            if cut is None or not _significant(y, lo, cut, hi):
                continue
            gain = abs(float(np.mean(y[lo:cut]) - np.mean(y[cut:hi])))
            if best is None or gain > best[0]:
                best = (gain, cut)
        if best is None:
            break
        bounds = sorted([*bounds, best[1]])
    return list(zip(bounds[:-1], bounds[1:], strict=True))


# -- per-step series and regime statistics ------------------------------------------------

def usage_wall(table: StepTable) -> AnyArray:
    """The wall seconds each row's ``cpu_s`` and ``preempt`` cover: they advance between
    the rank's step ends, so the time from its previous step's end (``end_s``) to this
    one's, between-steps work included; the step's own time where there is no previous
    step (a rank's first row, a missing record) or no ``end_s``. Divided by the step time
    instead, an evaluation between steps or another run's steps in the same process
    (an interleaved A/B) inflate one run's CPU share and preemption rate."""
    st = np.asarray(table["step_time_s"], dtype=np.float64)
    if not table.has_data("end_s") or len(table) < 2:
        return st
    rank, step, end = table["rank"], table["step"], table["end_s"]
    order = None if is_ordered(rank, step) else np.lexsort((step, rank))
    if order is not None:
        rank, step, end, st = rank[order], step[order], end[order], st[order]
    wall = np.empty_like(st)
    wall[0] = st[0]
    np.subtract(end[1:], end[:-1], out=wall[1:])
    with np.errstate(invalid="ignore"):
        own = ~(wall[1:] > 0)  # NaN too
    own |= rank[1:] != rank[:-1]
    own |= step[1:] != step[:-1] + 1
    wall[1:][own] = st[1:][own]
    if order is None:
        return wall
    out = np.empty_like(wall)
    out[order] = wall
    return out


def _per_step(table: StepTable) -> dict[str, AnyArray]:
    """Per-step series over ranks: the slowest rank's step time, summed tokens, the median
    rank's CPU share and preemption rate, and the latest wall time. On a rank x step grid
    (:func:`step_grid`) the maxima and sums are reductions along its rank axis, in rank
    order as the scatter takes the rows: the same numbers without an inverse of every row."""
    grid = step_grid(table)
    st = table["step_time_s"]
    st = np.where(np.isfinite(st), st, -np.inf)
    has_tokens = table.has_data("tokens")
    inv: AnyArray | None = None
    if grid is not None:  # no row-sized nan_to_num copies (see _grid_wall)
        steps = grid.steps
        out: dict[str, AnyArray] = {"step": steps, "step_time_s": _grid_max(grid, st),
                                    "wall_time_s": _grid_wall(grid, table["wall_time_s"])}
        out["tokens"] = (np.nan_to_num(grid.frame(table["tokens"]), nan=0.0).sum(axis=0)
                         + 0.0 if has_tokens else np.zeros(steps.size))
    else:
        tokens = np.nan_to_num(table["tokens"]) if has_tokens else None
        wall = np.nan_to_num(table["wall_time_s"], nan=-np.inf)
        steps, inv = unique_ints(table["step"], return_inverse=True)
        out = {"step": steps, "step_time_s": np.full(steps.size, -np.inf),
               "tokens": np.zeros(steps.size), "wall_time_s": np.full(steps.size, -np.inf)}
        np.maximum.at(out["step_time_s"], inv, st)
        if tokens is not None:
            np.add.at(out["tokens"], inv, tokens)
        np.maximum.at(out["wall_time_s"], inv, wall)
    n = steps.size
    usage = None
    with np.errstate(divide="ignore", invalid="ignore"):
        for col, key in (("cpu_s", "cpu_per_wall"), ("preempt", "preempt_per_s")):
            if not table.has_data(col):
                out[key] = np.full(n, np.nan)
                continue
            if usage is None:
                usage = usage_wall(table)
            v = table[col] / usage
            med = grid.median_over_ranks(v) if grid is not None else None
            if med is None:
                if inv is None:
                    inv = unique_ints(table["step"], return_inverse=True)[1]
                med = median_by(v, inv, n, unique_ints(table["rank"], return_inverse=True)[1])
            out[key] = med
    return out


def _grid_max(grid: StepGrid, v: AnyArray) -> AnyArray:
    """Each step's maximum over ranks of ``v`` (no NaN in it); -inf where no rank has it."""
    f = grid.frame(v)
    if grid.pos is not None:  # the cells no row fills are NaN
        f = np.where(np.isnan(f), -np.inf, f)
    out: AnyArray = f.max(axis=0)
    return out


def _grid_wall(grid: StepGrid, wall: AnyArray) -> AnyArray:
    """``_grid_max(grid, np.nan_to_num(wall, nan=-np.inf))`` without the copy: the maximum
    ignoring NaN, then nan_to_num's map of the result (NaN: no value, -inf; +-inf: the
    largest finite floats). The map keeps order, so the maximum picks the same value."""
    top = np.fmax.reduce(grid.frame(wall), axis=0)
    out: AnyArray = np.nan_to_num(top, nan=-np.inf)
    return out


def _finite_median(x: AnyArray) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.median(x)) if x.size else None


def condition_columns(conditions: Mapping[int, Sequence[Mapping[str, Any]]] | None
                      ) -> dict[str, AnyArray]:
    """Condition samples of all ranks as columns (NaN where a sample lacks a field).

    The last input is remembered (by identity): one analysis asks for the columns of the
    same run several times."""
    hit = _LAST_COLUMNS[0]  # one read: a (conditions, columns) pair, safe across threads
    if hit is not None and hit[0] is conditions and conditions is not None:
        return hit[1]
    samples = [s for rank in sorted(conditions or {}) for s in (conditions or {})[rank]]
    keys = ("wall_time_s", "interval_s", "ncpu", *_COND_FIELDS)

    def num(v: Any) -> float:
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else np.nan

    cols = {k: np.array([num(s.get(k)) for s in samples], dtype=float) for k in keys}
    _LAST_COLUMNS[0] = (conditions, cols)
    return cols


def window_values(cols: Mapping[str, AnyArray], key: str, t0: float, t1: float) -> AnyArray:
    """The finite values of ``key`` sampled between UNIX times t0 and t1; if none was (a
    window shorter than the sampling interval), those whose ``interval_s`` overlaps it."""
    wall, v, span = cols.get("wall_time_s"), cols.get(key), cols.get("interval_s")
    if wall is None or v is None or not wall.size:
        return np.array([])
    sel = (wall >= t0) & (wall <= t1) & np.isfinite(v)
    if not sel.any() and span is not None:  # a share taken just after the window covers it
        sel = (wall > t1) & (wall - np.nan_to_num(span, nan=0.0) < t1) & np.isfinite(v)
    return np.asarray(v[sel])


def _window_conditions(cols: Mapping[str, AnyArray], t0: float, t1: float
                       ) -> dict[str, float]:
    out: dict[str, float] = {}
    for key in _COND_FIELDS:
        vals = window_values(cols, key, t0, t1)
        if vals.size:
            out[key] = float(np.max(vals)) if key == "gpu_throttle_reasons" \
                else float(np.median(vals))
    return out


def _regime(i: int, s: dict[str, AnyArray], lo: int, hi: int,
            samples: Mapping[str, AnyArray]) -> Regime:
    st, tok = s["step_time_s"][lo:hi], s["tokens"][lo:hi]
    total = float(st.sum())
    wall = s["wall_time_s"][lo:hi]
    t0, t1 = float(wall[0] - st[0]), float(wall[-1])
    return Regime(
        index=i, first_step=int(s["step"][lo]), last_step=int(s["step"][hi - 1]),
        steps=hi - lo, step_time_s=float(np.median(st)),
        tokens_per_s=float(tok.sum()) / total if tok.sum() > 0 and total > 0 else None,
        cpu_per_wall=_finite_median(s["cpu_per_wall"][lo:hi]),
        preempt_per_s=_finite_median(s["preempt_per_s"][lo:hi]),
        conditions=_window_conditions(samples, t0, t1) if math.isfinite(t0) else {})


# -- attribution ---------------------------------------------------------------------------
def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def _throttled(r: Regime, ref: Regime) -> str | None:
    for key, what in (("cpu_mhz", "CPU clock"), ("gpu_sm_clock_mhz", "GPU SM clock")):
        q = _ratio(r.conditions.get(key), ref.conditions.get(key))
        if q is not None and q < CLOCK_RATIO:
            return (f"{what} {r.conditions[key]:,.0f} MHz against {ref.conditions[key]:,.0f} "
                    f"MHz in {ref.name}")
    reasons = r.conditions.get("gpu_throttle_reasons", 0.0)
    if reasons and not ref.conditions.get("gpu_throttle_reasons"):
        return f"NVML clock slow-down reasons set (0x{int(reasons):x}), none in {ref.name}"
    return None


def _queued(r: Regime, ref: Regime) -> str | None:
    """The main thread got less CPU and queued longer for it (schedstat)."""
    on = (r.conditions.get("main_oncpu_frac"), ref.conditions.get("main_oncpu_frac"))
    rq = (r.conditions.get("main_runq_frac"), ref.conditions.get("main_runq_frac"))
    if None in on or None in rq:
        return None
    assert on[0] is not None and on[1] is not None and rq[0] is not None and rq[1] is not None
    if on[0] < (1 - CPU_SHARE_DROP) * on[1] and rq[0] - rq[1] >= RUNQ_DELTA:
        return (f"the training thread ran {on[0]:.0%} of the wall time against {on[1]:.0%} "
                f"and waited for a CPU {rq[0]:.0%} of it against {rq[1]:.0%}")
    return None


def _contended(r: Regime, ref: Regime) -> str | None:
    why = _queued(r, ref)
    if why:
        return why
    cpu_q = _ratio(r.cpu_per_wall, ref.cpu_per_wall)
    pre = (r.preempt_per_s, ref.preempt_per_s)
    if (pre[0] is not None and pre[1] is not None and cpu_q is not None
            and pre[0] >= PREEMPT_RATIO * pre[1] and pre[0] - pre[1] >= PREEMPT_MIN_DELTA_PER_S
            and cpu_q < 1 - CPU_SHARE_DROP / 2):
        return (f"{pre[0]:,.0f} involuntary context switches per second against {pre[1]:,.0f}"
                f", {r.cpu_per_wall:.2f} CPU-s per wall-s against {ref.cpu_per_wall:.2f}")
    others = (r.conditions.get("others_cpu_cores"), ref.conditions.get("others_cpu_cores"))
    if others[0] is not None and others[1] is not None \
            and others[0] - others[1] >= OTHERS_CORES_DELTA:
        return f"other processes used {others[0]:.1f} CPU cores against {others[1]:.1f}"
    steal = (r.conditions.get("host_steal_frac"), ref.conditions.get("host_steal_frac"))
    if steal[0] is not None and steal[1] is not None and steal[0] - steal[1] >= STEAL_DELTA:
        return f"hypervisor steal {steal[0]:.0%} of CPU time against {steal[1]:.0%}"
    return None


def host_took_cpu(cpu_per_wall: float, preempt_per_s: float, ref_cpu_per_wall: float,
                  ref_preempt_per_s: float) -> str | None:
    """Why a stretch of wall time (a gap, a slow step) was contention, from the process's
    own CPU accounting against a reference (the same thresholds as a regime's), or None."""
    def one(cpu: float, pre: float) -> Regime:
        return Regime(index=0, first_step=0, last_step=0, steps=1, step_time_s=1.0,
                      tokens_per_s=None, cpu_per_wall=cpu if math.isfinite(cpu) else None,
                      preempt_per_s=pre if math.isfinite(pre) else None)
    return _contended(one(cpu_per_wall, preempt_per_s), one(ref_cpu_per_wall,
                                                            ref_preempt_per_s))


def _environment(r: Regime, ref: Regime) -> tuple[str, str] | None:
    why = _throttled(r, ref)
    if why:
        return "throttling", why
    why = _contended(r, ref)
    return ("contention", why) if why else None


def environment_cause(cur: Mapping[str, float], ref: Mapping[str, float],
                      ref_steps: tuple[int, int] = (0, 0)) -> tuple[str, str] | None:
    """``("throttling" | "contention", evidence)`` when the environment explains a stretch
    of steps against a reference stretch (steps ``ref_steps``), by the thresholds a
    regime is attributed with; else None. The live alert rules call it.

    Both mappings hold medians: ``cpu_per_wall`` and ``preempt_per_s`` (per step, from
    the step records' ``cpu_s`` and ``preempt``) and any condition field
    (``main_oncpu_frac``, ``main_runq_frac``, ``cpu_mhz``, ...); a missing or non-finite
    one is not evidence.
    """
    def regime(d: Mapping[str, float]) -> Regime:
        def num(key: str) -> float | None:
            v = d.get(key)
            return float(v) if v is not None and math.isfinite(v) else None
        return Regime(index=0, first_step=ref_steps[0], last_step=ref_steps[1], steps=1,
                      step_time_s=1.0, tokens_per_s=None, cpu_per_wall=num("cpu_per_wall"),
                      preempt_per_s=num("preempt_per_s"),
                      conditions={k: v for k in _COND_FIELDS if (v := num(k)) is not None})
    return _environment(regime(cur), regime(ref))


def _attribute(r: Regime, ref: Regime) -> None:
    slower = r.step_time_s / ref.step_time_s - 1.0
    if r is ref:
        r.cause, r.evidence = "reference", "the fastest regime holding a tenth of the steps"
        return
    if slower < 0:
        r.cause, r.evidence = "faster", f"steps {-slower:.0%} faster than {ref.name}"
        return
    how = f"{1 + slower:.1f}x as long as" if slower >= 1 else f"{slower:.0%} slower than"
    head = f"steps {how} {ref.name}: "
    env = _environment(r, ref)
    if env:
        r.cause, r.evidence = env[0], head + env[1]
        return
    cpu_q = _ratio(r.cpu_per_wall, ref.cpu_per_wall)
    if cpu_q is None:
        r.cause, r.evidence = "unexplained", head + "no CPU accounting recorded"
    elif cpu_q < 1 - CPU_SHARE_DROP:
        r.cause = "waiting"
        r.evidence = head + (f"{r.cpu_per_wall:.2f} CPU-s per wall-s against "
                             f"{ref.cpu_per_wall:.2f} with no more preemptions: the process "
                             "was waiting (I/O, a queue, a sleep)")
    else:
        r.cause = "more work"
        r.evidence = head + (f"the CPU share held ({r.cpu_per_wall:.2f} against "
                             f"{ref.cpu_per_wall:.2f} CPU-s per wall-s): more work per step")


def find_regimes(table: StepTable, steady: AnyArray,
                 conditions: Mapping[int, Sequence[Mapping[str, Any]]] | None = None
                 ) -> Regimes:
    """The regimes of a run's ``steady`` rows (a boolean mask: warm-up excluded).

    ``conditions``: ``RunDir.read_conditions()`` (samples per rank), optional evidence.
    """
    t = table.select(steady) if len(table) else table
    t = t.select(np.isfinite(t["step_time_s"])) if len(t) else t
    if not len(t):
        return Regimes([], None)
    s = _per_step(t)
    samples = condition_columns(conditions)
    bounds = segment(s["step_time_s"])
    regs = [_regime(i, s, lo, hi, samples) for i, (lo, hi) in enumerate(bounds)]
    n = sum(r.steps for r in regs)
    big = [r for r in regs if r.steps >= MIN_REFERENCE_FRAC * n] or regs
    ref = min(big, key=lambda r: r.step_time_s)
    for r in regs:
        _attribute(r, ref)
    clean = [r for r in regs if r.cause not in ENVIRONMENT_CAUSES] or regs
    chosen = max(clean, key=lambda r: (r.steps, r.index))
    chosen.steady = True
    return Regimes(regs, chosen.index)
