"""The speed ledger of an A/B comparison: each speed metric with a noise-aware interval.

Which steps count and how each metric is computed: ``speed_sample`` (warm-up and outlier
steps excluded, the formulas of ``summary.summarize``); MFU is tokens/s times the run's own
``summarize`` MFU-per-token/s factor.

Uncertainty: a percentile bootstrap (Efron & Tibshirani 1993, ch. 13) over steps (a step
keeps all its ranks' rows together), each run resampled independently, gives an interval
for the relative difference B/A - 1. A difference counts only when that interval excludes
zero AND the point difference is larger than the runs' own noise, the largest of:
each run's step-to-step spread of the metric (robust sigma, 1.4826 x MAD, over the median),
each run's split-half disagreement (the metric on the first half of the kept steps vs the
second half: drift), and ``MIN_EFFECT_REL``. Why not the interval alone: it measures how
well the medians are known, not how much two launches of one configuration differ
(placement, allocator state, neighbours' load), which two runs cannot measure; the spread
and drift are the conservative stand-in. When repeats of the baseline are given, how far
each lands from A is that run-to-run noise, measured, and joins the maximum. Two runs
launched one after the other on a shared machine see different load: interleave or repeat
them. The seed is injected so results are reproducible.

Example::

    ledger = speed_ledger(table_a, meta_a, table_b, meta_b, seed=0)
    ledger.verdict            # "faster" | "slower" | "no significant difference"
                              # | "inconclusive" (set by compare_runs when conditions differ)
    ledger.reason             # one sentence: why

Shares (``*_frac``, 0..1) are also compared in percentage points (``diff_pp``): a share
near zero (0.0% -> 0.1% data wait) is "+0.1 pp", not "+297.6%", and a share change smaller
than ``MIN_SHARE_DIFF`` is never called a change.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...schema import RunMeta, StepTable
from ..summary import Conditions
from .sample import (
    CHUNK_FLOATS,
    METRICS,
    FloatArray,
    Stat,
    StepSample,
    shared_products,
    split_half_rel,
    spread_rel,
    step_sample,
)

__all__ = [
    "SpeedMetric", "SpeedLedger", "speed_ledger", "MIN_EFFECT_REL", "N_BOOT", "CI_LEVEL",
    "MAX_BOOT_UNITS", "MIN_SHARE_DIFF", "mark_inconclusive", "kept_run_speeds",
    "prepare_speed",
]

# Smallest relative difference ever called a change. stepscope's default (the field report
# gives none): below ~1% step-time medians of identical runs disagree even on a dedicated
# accelerator. Pass ``min_effect_rel`` to change it.
MIN_EFFECT_REL = 0.01
# Smallest change of a share of step time ever called a change: 1 percentage point (the
# health rules' data-wait threshold is 5 pp; below 1 pp is timer jitter on a shared host).
MIN_SHARE_DIFF = 0.01
# Bootstrap replicates and interval level: 2000 replicates keep the 95% percentile
# interval's Monte-Carlo error small (Efron & Tibshirani 1993, sec. 19.3 suggest >= 1000).
N_BOOT = 2000
CI_LEVEL = 0.95
# Runs with more steady steps are resampled in blocks of consecutive steps (at most this
# many blocks): the non-overlapping block bootstrap (Carlstein 1986), which bounds the cost
# on long runs and keeps the step-time autocorrelation inside a block.
MAX_BOOT_UNITS = 1000

# The ledger's verdict follows the first of these both runs measured.
_PRIMARY = ("tokens_per_s", "samples_per_s", "step_time_s")


@dataclass
class SpeedMetric:
    """One metric of the ledger. ``ci_rel`` bounds B/A - 1; ``change`` is the call."""

    name: str
    a: float | None
    b: float | None
    better: str  # "lower" | "higher"
    diff: float | None = None
    diff_rel: float | None = None
    ci: tuple[float, float] | None = None
    ci_rel: tuple[float, float] | None = None
    noise_rel: float | None = None
    change: str = "unknown"  # "better" | "worse" | "no significant difference" | "unknown"
    diff_pp: float | None = None  # shares only: B - A in percentage points

    @property
    def is_share(self) -> bool:
        return self.name.endswith("_frac")

    def to_dict(self) -> dict[str, Any]:
        return {
            "a": self.a, "b": self.b, "better": self.better, "diff": self.diff,
            "diff_rel": self.diff_rel, "diff_pp": self.diff_pp,
            "ci": list(self.ci) if self.ci else None,
            "ci_rel": list(self.ci_rel) if self.ci_rel else None,
            "noise_rel": self.noise_rel, "change": self.change,
        }

    @classmethod
    def from_dict(cls, name: str, d: Mapping[str, Any]) -> SpeedMetric:
        """The metric ``to_dict`` gave (an interval's bound stored as null is NaN)."""
        def pair(v: Any) -> tuple[float, float] | None:
            return None if v is None else (_nan(v[0]), _nan(v[1]))
        return cls(name, d["a"], d["b"], d["better"], diff=d["diff"], diff_rel=d["diff_rel"],
                   ci=pair(d["ci"]), ci_rel=pair(d["ci_rel"]), noise_rel=d["noise_rel"],
                   change=d["change"], diff_pp=d["diff_pp"])


@dataclass
class SpeedLedger:
    verdict: str  # "faster" | "slower" | "no significant difference" | "inconclusive"
    primary: str | None
    metrics: dict[str, SpeedMetric]
    steps_used: tuple[int, int]
    excluded: dict[str, tuple[int, int]] = field(default_factory=dict)
    ci_level: float = CI_LEVEL
    seed: int = 0
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {k: m.to_dict() for k, m in self.metrics.items()}
        out.update(verdict=self.verdict, reason=self.reason, primary=self.primary,
                   ci_level=self.ci_level,
                   steps_used=list(self.steps_used), seed=self.seed,
                   excluded={k: list(v) for k, v in self.excluded.items()})
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SpeedLedger:
        """The ledger ``to_dict`` gave."""
        own = ("verdict", "reason", "primary", "ci_level", "steps_used", "seed", "excluded")
        metrics = {k: SpeedMetric.from_dict(k, v) for k, v in d.items() if k not in own}
        a, b = d["steps_used"]
        return cls(verdict=d["verdict"], primary=d["primary"], metrics=metrics,
                   steps_used=(a, b), ci_level=d["ci_level"], seed=d["seed"],
                   reason=d["reason"],
                   excluded={k: (v[0], v[1]) for k, v in d["excluded"].items()})


def _nan(v: float | None) -> float:
    return math.nan if v is None else float(v)


def _none(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _weights(rng: np.random.Generator, n_steps: int, n_boot: int) -> FloatArray:
    draws = rng.integers(0, n_steps, size=(n_boot, n_steps))
    offs = (np.arange(n_boot) * n_steps)[:, None]
    counts = np.bincount((draws + offs).ravel(), minlength=n_boot * n_steps)
    return counts.reshape(n_boot, n_steps).astype(np.float64)


@dataclass(frozen=True)
class _Boot:
    """One run's bootstrap: its blocked sample and the replicate weights, in chunks that
    bound the floats one statistic holds at once (``CHUNK_FLOATS``)."""

    sample: StepSample
    weights: list[FloatArray]

    @classmethod
    def of(cls, s: StepSample, n_boot: int, seed: int, which: int) -> _Boot:
        """Every metric of a run draws from the same stream (seed, run): the metrics of one
        replicate come from the same resampled units and results repeat exactly. So the
        weights are drawn once per run, not once per metric (and the run blocked once)."""
        b = s.blocked(MAX_BOOT_UNITS)
        rng = np.random.default_rng([seed, which])
        draw = max(1, CHUNK_FLOATS // max(1, b.step_time.size))  # the draws' temporaries
        w = np.concatenate([_weights(rng, b.n_steps, min(draw, n_boot - lo))
                            for lo in range(0, n_boot, draw)])
        # A statistic holds a few (replicates x units) and (replicates x ranks) matrices:
        # chunks that bound those, not replicates x units x ranks as the draws do. At 1,024
        # ranks that was 4 replicates a chunk, and 8,000 small products took 7 s of compare.
        rows = max(1, CHUNK_FLOATS // max(1, *b.step_time.shape))
        return cls(b, [w[lo:lo + rows] for lo in range(0, n_boot, rows)])

    def replicates(self, stat: Stat) -> FloatArray:
        """``n_boot`` replicates of ``stat`` over the units of the blocked sample."""
        return np.concatenate([stat(self.sample, w) for w in self.weights])


def _has(s: StepSample, col: str) -> bool:
    return s.n_steps > 0 and bool(np.any(getattr(s, col) > 0))


def _judge(m: SpeedMetric, ci_rel: tuple[float, float], noise: float) -> str:
    assert m.diff_rel is not None
    if not (ci_rel[0] > 0 or ci_rel[1] < 0) or abs(m.diff_rel) <= noise:
        return "no significant difference"
    up = m.diff_rel > 0
    return "better" if up == (m.better == "higher") else "worse"


def _point(name: str, s: StepSample) -> float | None:
    """The metric over all kept steps of one run (None when the run lacks its data)."""
    spec = METRICS[name]
    if not _has(s, spec.column):
        return None
    scale = 1.0
    if name == "mfu":
        if s.mfu_per_token_s is None:
            return None
        scale = s.mfu_per_token_s
    return _none(float(spec.stat(s, np.ones((1, s.n_steps)))[0]) * scale)


@dataclass(frozen=True)
class _RunSpeed:
    """What the ledger needs of one run's sample: each metric's point value, its unscaled
    statistic, split-half drift and step-to-step spread, and the bootstrap over the
    blocked sample. Computed run by run, so one run's (steps x ranks) matrices are let go
    before the next run's are made (~500 MB each at 9.6 million rows)."""

    n_steps: int
    warmup_rows: int
    outlier_steps: int
    mem_peak_bytes: float | None
    point: dict[str, float | None]
    raw: dict[str, float]
    split: dict[str, float]
    spread: dict[str, float]
    boot: _Boot | None

    @classmethod
    def of(cls, s: StepSample, boot: tuple[int, int, int] | None) -> _RunSpeed:
        """``boot``: (replicates, seed, which run) to draw the bootstrap, or None."""
        point = {name: _point(name, s) for name in METRICS} if s.n_steps else {}
        raw: dict[str, float] = {}
        split: dict[str, float] = {}
        spread: dict[str, float] = {}
        for name, value in point.items():
            if value is None or boot is None:
                continue  # the ledger compares only metrics both runs have
            spec = METRICS[name]
            raw[name] = _raw(s, spec.stat)
            split[name] = split_half_rel(s, spec.stat)
            spread[name] = spread_rel(s, spec.per_step)
        return cls(s.n_steps, s.warmup_rows, s.outlier_steps, s.mem_peak_bytes, point, raw,
                   split, spread, _Boot.of(s, *boot) if boot and s.n_steps else None)


_Key = tuple[StepTable, RunMeta | None, Conditions | None, int, int, int]
_KEPT: contextvars.ContextVar[list[tuple[_Key, _RunSpeed]] | None] = \
    contextvars.ContextVar("stepscope_kept_run_speeds", default=None)


@contextlib.contextmanager
def kept_run_speeds() -> Iterator[None]:
    """Within the block, a run's share of a speed ledger (its step sample reduced to point
    values, noise and bootstrap) computed early by ``prepare_speed`` is taken by the next
    ``speed_ledger`` of the same table, meta and conditions objects, seed and replicates,
    instead of computed again: ``compare`` prepares run A's share while run B's files are
    decoded. A share is let go once taken (~50 MB at 1,024 ranks), or when the block ends."""
    token = _KEPT.set([])
    try:
        yield
    finally:
        _KEPT.reset(token)


def _speed_of(table: StepTable, meta: RunMeta | None, conditions: Conditions | None,
              n_boot: int, seed: int, which: int) -> _RunSpeed:
    kept = _KEPT.get() or []
    for i, (key, share) in enumerate(kept):
        if (key[0] is table and key[1] is meta and key[2] is conditions
                and key[3:] == (n_boot, seed, which)):
            del kept[i]  # taken: let go with the ledger
            return share
    return _RunSpeed.of(step_sample(table, meta, conditions), (n_boot, seed, which))


def prepare_speed(table: StepTable, meta: RunMeta | None, conditions: Conditions | None = None,
                  *, seed: int = 0, n_boot: int = N_BOOT, which: int = 0) -> None:
    """Compute one run's share of the speed ledger now, inside ``kept_run_speeds()``, where
    the next ``speed_ledger`` takes it for the same table, meta and conditions objects, seed
    and replicates (``which``: 0 for run A, 1 for run B). Outside the block: nothing done.

    Example::

        with kept_run_speeds():
            prepare_speed(table_a, meta_a, cond_a, seed=0)   # e.g. while B is read
            ledger = speed_ledger(table_a, meta_a, table_b, meta_b, seed=0,
                                  conditions=(cond_a, cond_b))
    """
    kept = _KEPT.get()
    if kept is not None:
        share = _RunSpeed.of(step_sample(table, meta, conditions), (n_boot, seed, which))
        kept.append(((table, meta, conditions, n_boot, seed, which), share))


def _noise(name: str, ra: _RunSpeed, rb: _RunSpeed, repeats: Sequence[_RunSpeed],
           a: float, min_effect_rel: float) -> float:
    """The runs' own noise for one metric (see module doc), relative."""
    parts = [ra.split[name], rb.split[name], ra.spread[name], rb.spread[name],
             min_effect_rel]
    for rep in repeats:  # measured run-to-run noise: the baseline against its repeat
        value = rep.point.get(name)
        if value is not None:
            parts.append(abs(value / a - 1.0))
    return max(parts)


def _metric(name: str, ra: _RunSpeed, rb: _RunSpeed, repeats: Sequence[_RunSpeed],
            min_effect_rel: float) -> SpeedMetric:
    stat = METRICS[name].stat
    a, b = ra.point[name], rb.point[name]
    m = SpeedMetric(name, a, b, METRICS[name].better)
    if a is None or b is None or a == 0:
        return m
    assert ra.boot is not None and rb.boot is not None
    m.diff, m.diff_rel = b - a, b / a - 1.0
    boot_a = ra.boot.replicates(stat) * (a / ra.raw[name])
    boot_b = rb.boot.replicates(stat) * (b / rb.raw[name])
    ok = np.isfinite(boot_a) & np.isfinite(boot_b) & (boot_a != 0)
    tail = (1.0 - CI_LEVEL) / 2 * 100
    d = np.percentile(boot_b[ok] - boot_a[ok], [tail, 100 - tail])
    r = np.percentile(boot_b[ok] / boot_a[ok] - 1.0, [tail, 100 - tail])
    m.ci, m.ci_rel = (float(d[0]), float(d[1])), (float(r[0]), float(r[1]))
    noise = _noise(name, ra, rb, repeats, a, min_effect_rel)
    m.noise_rel = _none(noise)
    m.change = _judge(m, m.ci_rel, noise)
    if m.is_share:
        m.diff_pp = 100.0 * m.diff
        if abs(m.diff) < MIN_SHARE_DIFF:
            m.change = "no significant difference"
    return m


def _raw(s: StepSample, stat: Stat) -> float:
    """The unscaled statistic (MFU's replicates are scaled by point / raw)."""
    return float(stat(s, np.ones((1, s.n_steps)))[0])


def _memory(sa: _RunSpeed, sb: _RunSpeed) -> SpeedMetric:
    # A peak is one number per run, not a per-step sample: no interval, and any growth
    # is reported as it is (memory is deterministic for a fixed configuration).
    m = SpeedMetric("mem_peak_bytes", sa.mem_peak_bytes, sb.mem_peak_bytes, "lower")
    if m.a and m.b is not None:
        m.diff, m.diff_rel = m.b - m.a, m.b / m.a - 1.0
        m.change = ("no significant difference" if m.diff == 0
                    else "better" if m.diff < 0 else "worse")
    return m


def _reason(verdict: str, primary: str | None, metrics: dict[str, SpeedMetric]) -> str:
    m = metrics.get(primary) if primary else None
    if m is None or m.diff_rel is None or m.ci_rel is None:
        return "the runs share no speed metric with data in both, so nothing was compared"
    lo, hi = m.ci_rel
    noise = f"{m.noise_rel:.1%}" if m.noise_rel is not None else "unknown"
    what = (f"{m.name} {m.diff_rel:+.1%} (95% CI {lo:+.1%}..{hi:+.1%}) against the runs' "
            f"own noise of {noise}")
    if verdict == "no significant difference":
        return f"{what}: the difference is within the noise or the interval includes zero"
    return f"{what}: B is {verdict}"


def mark_inconclusive(ledger: SpeedLedger, why: str) -> None:
    """The runs' conditions differ: no speed call can be attributed to the change."""
    ledger.verdict = "inconclusive"
    ledger.reason = why


def speed_ledger(table_a: StepTable, meta_a: RunMeta | None, table_b: StepTable,
                 meta_b: RunMeta | None, *, seed: int = 0, n_boot: int = N_BOOT,
                 min_effect_rel: float = MIN_EFFECT_REL,
                 baseline_repeats: Sequence[tuple[StepTable, RunMeta | None]] = (),
                 conditions: tuple[Conditions | None, Conditions | None] = (None, None),
                 ) -> SpeedLedger:
    """Speed metrics of B against baseline A, each with a bootstrap interval and a call.

    ``baseline_repeats``: other runs of A's exact configuration; how far each lands from A
    is measured run-to-run noise, added to the noise a difference must exceed.

    Example::

        ledger = speed_ledger(ta, ma, tb, mb, seed=0)
        ledger.metrics["tokens_per_s"].ci_rel    # e.g. (0.081, 0.094): B is 8-9% faster
    """
    # One run's sample at a time: each is reduced to what the ledger needs, then let go.
    sa = _speed_of(table_a, meta_a, conditions[0], n_boot, seed, 0)
    sb = _speed_of(table_b, meta_b, conditions[1], n_boot, seed, 1)
    repeats = [_RunSpeed.of(step_sample(t, m), None) for t, m in baseline_repeats]
    metrics: dict[str, SpeedMetric] = {}
    if sa.n_steps and sb.n_steps:
        assert sa.boot is not None and sb.boot is not None
        with shared_products([w for boot in (sa.boot, sb.boot) for w in boot.weights]):
            for name in METRICS:
                metrics[name] = _metric(name, sa, sb, repeats, min_effect_rel)
    metrics["mem_peak_bytes"] = _memory(sa, sb)
    primary = next((p for p in _PRIMARY if p in metrics and metrics[p].diff_rel is not None),
                   None)
    verdict = "no significant difference"
    if primary is not None:
        change = metrics[primary].change
        verdict = {"better": "faster", "worse": "slower"}.get(change, verdict)
    return SpeedLedger(
        verdict=verdict, primary=primary, metrics=metrics,
        steps_used=(sa.n_steps, sb.n_steps), seed=seed,
        reason=_reason(verdict, primary, metrics),
        excluded={"warmup_rows": (sa.warmup_rows, sb.warmup_rows),
                  "outlier_steps": (sa.outlier_steps, sb.outlier_steps)},
    )
